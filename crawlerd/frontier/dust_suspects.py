"""The DUST learner's suspect table (``crawlerd.frontier.dust``): skeleton keys of the URLs
admitted lately, so that a new URL with the skeleton of one admitted before is a suspect.

The table is a native kernel (``crawlerd._native.suspects``: one C pass per batch); its
plain-Python reference is ``crawlerd._native.suspects_ref``."""

from crawlerd._native.suspects import WAYS, ClassTable

__all__ = ["ClassTable", "WAYS"]
