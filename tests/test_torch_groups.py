"""DpComm over the process groups a stack already has (explicit groups, a DeviceMesh with
its own dim names): no group created, results equal the reference, mismatches refused."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.multiproc


@pytest.mark.parametrize("layout", [(2, 1), (2, 2), (3, 1), (4, 2), (4, 1, 2), (4, 2, 2)],
                         ids=lambda l: f"w{l[0]}dp{l[1]}" + (f"cp{l[2]}" if len(l) > 2 else ""))
def test_adopted_groups_create_none_and_match_the_reference(gloo_worlds, layout):
    dp = layout[1]
    cases = [dict(counts=[3 + i if i % 2 == 0 else 0 for i in range(dp)], mode=m,
                  partial=p, seed=k)
             for k, (m, p) in enumerate([("max_len", True), ("sum_len", False),
                                         ("gatherv", True), ("gatherv", False)])]
    res = gloo_worlds(layout[0]).run("groups_jobs:check_adopted", layout, cases)
    for r in res:
        assert r["created"] == {"explicit": 0, "mesh": 0}
        assert r["done"] == 2 * 4 * len(cases)
        cp = layout[2] if len(layout) > 2 else 1
        n_groups = (layout[0] > layout[1] * cp) * 2 + (cp > 1)   # tp (caller's, mesh's), cp
        assert r["after_destroy"] == [True] * n_groups, r


def test_mismatched_groups_are_refused(gloo_worlds):
    res = gloo_worlds(4).run("groups_jobs:check_mismatched")
    for rank, r in enumerate(res):
        assert f"attn_tp_group is a group that global rank {rank} is not a member" \
            in r["foreign"], r
        assert "attn_tp_group holds global ranks" in r["other"], r
        assert r["missing"].startswith("DpxValueError: attn_tp_group= is needed"), r
        assert "cpu_group holds global ranks" in r["cpu"], r
        assert "mesh of shape (4, 1) does not match layout" in r["mesh"], r
        assert r["ok_dp"] == rank // 2
