NAME="simweb"
