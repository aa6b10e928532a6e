# The outlink record's fields, for kernels that read them in C (``intake.pyx``): a deleted field is
# a NULL slot there, so a reader checks for it (``linkrec.pyx`` keeps the Python-level rules).

cdef class Link:
    cdef object url
    cdef object fp
    cdef object host_key
    cdef object nofollow
