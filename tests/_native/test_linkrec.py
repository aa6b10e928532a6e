"""Link: the native record and its dataclass reference behave the same (fields, constructor,
equality, repr, pickling); the native one is not tracked by the cyclic collector."""

import copy
import gc
import pickle

import pytest

from crawlerd._native.linkrec import Link
from crawlerd._native.linkrec import followed as native_followed
from crawlerd._native.linkrec_ref import Link as RefLink
from crawlerd._native.linkrec_ref import followed as ref_followed
from crawlerd.records import Link as RecordLink

IMPLS = [Link, RefLink]


@pytest.mark.parametrize("impl", IMPLS, ids=lambda c: c.__module__)
class TestLink:
    def test_fields_positional_keyword_and_default(self, impl):
        a = impl("http://a.test/x", 2**64 - 1, "http://a.test")
        assert (a.url, a.fp, a.host_key, a.nofollow) == ("http://a.test/x", 2**64 - 1, "http://a.test", False)
        b = impl(url="http://a.test/x", host_key="http://a.test", fp=2**64 - 1, nofollow=True)
        assert b.nofollow is True
        b.nofollow = False
        assert a == b
        with pytest.raises(TypeError):
            impl("http://a.test/x", 1)                  # host_key is required
        with pytest.raises(TypeError):
            impl("u", 1, "h", False, "extra")

    def test_equality_field_by_field_and_only_with_its_own_kind(self, impl):
        a = impl("u", 1, "h")
        assert a == impl("u", 1, "h")
        for other in (impl("v", 1, "h"), impl("u", 2, "h"), impl("u", 1, "k"), impl("u", 1, "h", True)):
            assert a != other
        assert a != ("u", 1, "h", False)
        other_kind = RefLink if impl is Link else Link
        assert a != other_kind("u", 1, "h")
        with pytest.raises(TypeError):
            hash(a)                                     # compared by value and mutable: unhashable

    def test_repr_and_pickle_and_copy(self, impl):
        a = impl("http://a.test/'q'", 7, "http://a.test", True)
        assert repr(a) == "Link(url=\"http://a.test/'q'\", fp=7, host_key='http://a.test', nofollow=True)"
        for proto in range(2, pickle.HIGHEST_PROTOCOL + 1):     # (a slotted dataclass: from 2)
            b = pickle.loads(pickle.dumps(a, protocol=proto))
            assert type(b) is impl and b == a
        c = copy.copy(a)
        assert c == a and c is not a

    def test_match_args(self, impl):
        match impl("u", 1, "h", True):
            case impl(url, fp, host_key, nofollow):
                assert (url, fp, host_key, nofollow) == ("u", 1, "h", True)
            case _:
                pytest.fail("no match")


def test_records_link_is_the_native_one_and_the_collector_does_not_track_it():
    assert RecordLink is Link
    assert not gc.is_tracked(Link("u", 1, "h"))
    assert gc.is_tracked(RefLink("u", 1, "h"))


@pytest.mark.parametrize("impl", IMPLS, ids=lambda c: c.__module__)
def test_a_deleted_field_is_an_attribute_error_everywhere(impl):
    a = impl("u", 1, "h")
    del a.url
    for read in (lambda: a.url, lambda: repr(a), lambda: a == impl("u", 1, "h")):
        with pytest.raises(AttributeError):
            read()
    a.url = "v"
    assert a == impl("v", 1, "h")


def test_the_native_fields_read_as_a_slotted_dataclass_reads_them():
    # member descriptors (read inline by the interpreter), not properties (a C call per read)
    assert all(type(Link.__dict__[name]).__name__ == "member_descriptor" for name in Link.__match_args__)


@pytest.mark.parametrize("followed", [native_followed, ref_followed], ids=["native", "ref"])
def test_followed_keeps_the_followable_links_in_order_and_their_hosts(followed):
    links = [Link("http://a.test/1", 1, "http://a.test"), RefLink("http://b.test/1", 2, "http://b.test", True),
             Link("http://c.test/1", 3, "http://c.test", True), RefLink("http://a.test/2", 4, "http://a.test"),
             Link("http://d.test/1", 5, "http://d.test", 0), Link("http://e.test/1", 6, "http://e.test", "")]
    follow, hosts = followed(links)
    assert follow == [links[0], links[3], links[4], links[5]] and follow is not links
    assert all(a is b for a, b in zip(follow, [links[0], links[3], links[4], links[5]], strict=True))
    assert hosts == {"http://a.test", "http://d.test", "http://e.test"}
    assert followed([]) == ([], set())
    gone = Link("http://f.test/1", 7, "http://f.test")
    del gone.nofollow
    with pytest.raises(AttributeError):
        followed([gone])
