"""bench/dust_bench.py: the judge (duplicates by the variant oracle, false skips) on a made-up ledger."""


from crawlerd.simweb.ledger import LedgerEntry
from crawlerd.simweb.site import Site
from tests.bench.scripts import load_bench

bench = load_bench("dust_bench.py")


def test_judge_counts_pages_fetched_again_under_another_url_and_lost_skips():
    site = Site(40, seed=3, variant_share=0.8).describe(8000)
    name = next(n for n, h in site["hosts"].items() if "print" in h["variants"] and "paged" in h["variants"])
    plain = next(n for n, h in site["hosts"].items() if not h["variants"] and h["role"] == "normal" and n != "h0.sim")
    targets = [(name, "/robots.txt"), (name, "/p/1.html"), (name, "/p/1.html?view=print"),   # a duplicate
               (name, "/p/1.html?view=print"),                                               # a refetch: not
               (name, "/p/1.html?page=2"),                                                   # another page
               (plain, "/p/1.html"), (plain, "/p/1.html?x=1")]                               # no variants host
    entries = [LedgerEntry(seq=i, conn=1, host=h, ip="", method="GET", target=t, status=200)
               for i, (h, t) in enumerate(targets)]
    skipped = [{"url": f"http://{name}:8000/p/1.html?view=print&x"},     # its page was fetched
               {"url": f"http://{name}:8000/p/1.html?page=3"}]           # a page nobody fetched: lost
    j = bench.judge(entries, site, skipped)
    assert j["pages_200"] == 6 and j["variant_dups"] == 1 and j["dup_by_kind"] == {"print": 1}
    assert j["false_skips"] == 1 and j["false_skip_examples"] == [skipped[1]["url"]]
    assert abs(j["dup_share"] - 1 / 6) < 1e-9
