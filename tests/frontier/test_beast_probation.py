"""BEAST's probation: a domain nobody vouches for waits for the next queue, then passes once per window."""



from tests.frontier.budget_parts import Parts


def test_on_probation_a_domain_nobody_vouches_for_waits_for_the_next_queue(tmp_path):
    p = Parts(tmp_path / "b", probation=True)
    b = p.beast
    p.graph.add_root("seed.org")
    assert p.offer("seed.org", [b"s0", b"s1"]) == [b"s0", b"s1"]     # a trust root: not on probation
    assert p.offer("spam.net", [b"f0", b"f1", b"f2"]) == []            # in-degree 0: nothing passes now
    assert b.domain("spam.net")["on_probation"] and b.domain("spam.net")["queue"] == 1
    assert b.readmit(100) == []                                        # not in the reader's queue
    assert b.readmit(2, advance=True) == [b"f0", b"f1"]                # the next queue: its base budget
    assert b.reader == 1 and b.domain("spam.net")["queue"] == 4      # still on probation: the next window
    assert b.stats()["probation"] == 1
    p.check()
    p.close()


def test_on_probation_a_vouch_lets_the_domain_pass_at_once(tmp_path):
    p = Parts(tmp_path / "b", probation=True)
    b = p.beast
    p.graph.add_root("seed.org")
    assert p.offer("x.com", [f"r{i}".encode() for i in range(10)]) == []
    p.edges.add("seed.org", ["x.com"])
    p.edges.flush()                                   # in-degree 1: budget 2 + 3 in the reader's queue
    assert not b.domain("x.com")["on_probation"]
    assert b.readmit(100) == [b"r0", b"r1", b"r2", b"r3", b"r4"]
    assert p.offer("x.com", [b"late"]) == []          # behind its own backlog, as any domain
    p.check()
    p.close()


def test_on_probation_a_domain_nobody_vouches_for_passes_once_per_window(tmp_path):
    p = Parts(tmp_path / "b", queues=4, max_spread=64, probation=True)
    b = p.beast
    p.graph.add_root("seed.org")
    p.edges.add("seed.org", ["good.com"])
    p.edges.flush()
    p.offer("good.com", [f"g{i}".encode() for i in range(2000)])
    p.offer("spam.net", [f"s{i}".encode() for i in range(2000)])
    planned = {"good.com": [], "spam.net": []}     # the queues each domain is listed in, in order
    for _ in range(1000):                     # windows of 4, 8, 16, 32 queues
        if b.reader >= 60:
            break
        for d, qs in planned.items():
            q = b.domain(d)["queue"]
            if not qs or qs[-1] != q:
                qs.append(q)
        b.readmit(1, advance=True)
    assert planned["spam.net"] == [1, 4, 12, 28, 60]    # the queue after it was found, then once per window
    assert len(planned["good.com"]) > 3 * len(planned["spam.net"])
    p.check()
    p.close()


def test_probation_keeps_a_farm_of_fresh_domains_out_while_the_reader_stands(tmp_path):
    """Fresh domains found while honest work is ready: without probation each passes its base budget
    in the reader's queue at once; with it none passes until the reader moves on, and then each
    passes its base budget (delayed, never dropped)."""
    farm = [f"spam{i}.net" for i in range(200)]
    passed = {}
    for probation in (False, True):
        p = Parts(tmp_path / str(probation), probation=probation)
        passed[probation] = sum(len(p.offer(f, [f"{f}/{k}".encode() for k in range(50)])) for f in farm)
        if probation:
            assert len(p.beast.readmit(2 * len(farm), advance=True)) == 2 * len(farm)
            assert p.beast.reader == 1
            assert p.beast.waiting == 48 * len(farm)
        p.check()
        p.close()
    assert passed == {False: 2 * len(farm), True: 0}
