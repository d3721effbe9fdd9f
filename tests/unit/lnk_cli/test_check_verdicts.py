"""Verdicts: the sandbox's answer can make a verdict worse, never better, where the outside
sees for itself; a malformed or missing answer is an incomplete check, not a pass."""

from __future__ import annotations

from typing import Any

import pytest

from lnk_cli.check.plan import ALLOWED, KNOWN_GAP, LEAKED, REFUSED, Evidence, Probe
from lnk_cli.check.verdicts import Outside, ProbesFailed, judge_all, judge_probe
from lnk_inside.probes import MARKER_TIME
from lnk_shared.spec import Origin
from lnk_shared.spec_models import parse_model_table

SECRET = "ab" * 32
STOPPED: dict[str, Any] = {"outcome": "stopped", "detail": "EACCES", "data": ""}
THROUGH: dict[str, Any] = {"outcome": "through", "detail": "ok", "data": ""}


def probe(kind: str, expected: str = REFUSED, **evidence: Any) -> Probe:
    return Probe("p", "tried", expected, {"kind": "x"}, (Evidence(kind, **evidence),))


def test_a_secret_in_the_answer_is_a_leak() -> None:
    p = probe("secret", value=SECRET)
    answer = {"outcome": "through", "detail": "read", "data": f"bait {SECRET}\n"}
    assert judge_probe(p, answer, Outside()).verdict == LEAKED


def test_a_secret_anywhere_in_the_output_is_a_leak_even_if_the_answer_says_stopped() -> None:
    p = probe("secret", value=SECRET)
    assert judge_probe(p, STOPPED, Outside(output=f"noise {SECRET}")).verdict == LEAKED


def test_a_read_that_came_back_without_the_secret_is_refused() -> None:
    p = probe("secret", value=SECRET)
    answer = {"outcome": "through", "detail": "read", "data": ""}  # an empty stand-in
    assert judge_probe(p, answer, Outside()).verdict == REFUSED


def test_a_granted_read_is_allowed() -> None:
    p = probe("secret", ALLOWED, value=SECRET)
    answer = {"outcome": "through", "detail": "read", "data": SECRET}
    assert judge_probe(p, answer, Outside()).verdict == ALLOWED


def test_a_listing_with_a_real_name_is_a_leak() -> None:
    p = probe("names", names=("id_ed25519", "lnk-check-x"))
    answer = {"outcome": "through", "detail": "", "data": ["lnk-check-x"]}
    assert judge_probe(p, answer, Outside()).verdict == LEAKED
    other = {"outcome": "through", "detail": "", "data": ["something", 3]}
    assert judge_probe(p, other, Outside()).verdict == REFUSED


@pytest.mark.parametrize("answer", [STOPPED, THROUGH])
def test_a_file_that_exists_outside_decides_whatever_the_sandbox_says(
    answer: dict[str, Any],
) -> None:
    p = probe("created", path="/home/u/x")
    assert judge_probe(p, answer, Outside(exists={"/home/u/x": True})).verdict == LEAKED
    assert judge_probe(p, answer, Outside(exists={"/home/u/x": False})).verdict == REFUSED


def test_a_granted_write_that_did_not_land_is_refused() -> None:
    p = probe("created", ALLOWED, path="/w/f")
    assert judge_probe(p, THROUGH, Outside(exists={"/w/f": False})).verdict == REFUSED
    assert judge_probe(p, STOPPED, Outside(exists={"/w/f": True})).verdict == ALLOWED


def test_a_marked_mtime_is_a_leak() -> None:
    p = probe("marked", value=(1, 2), path="/w/.envrc")
    marked = Outside(mtimes={"/w/.envrc": MARKER_TIME * 1_000_000_000})
    assert judge_probe(p, STOPPED, marked).verdict == LEAKED
    assert judge_probe(p, THROUGH, Outside(mtimes={"/w/.envrc": 2})).verdict == REFUSED


def test_the_bait_server_log_makes_a_connection_a_leak() -> None:
    p = probe("server")
    seen = Outside(accepted=("lnk-check p",))
    assert judge_probe(p, STOPPED, seen).verdict == LEAKED
    assert judge_probe(p, STOPPED, Outside(accepted=("lnk-check other",))).verdict == REFUSED
    # A connection that said nothing (or something else) counts against every probe.
    assert judge_probe(p, STOPPED, Outside(accepted=("",))).verdict == LEAKED
    assert judge_probe(p, THROUGH, Outside()).verdict == LEAKED  # the sandbox's own word


def test_the_wire_log_makes_a_proxy_answer_a_leak() -> None:
    p = probe("wire", value="127.0.0.1:80")
    assert judge_probe(p, STOPPED, Outside(wire_allowed=frozenset({"127.0.0.1:80"}))).verdict == (
        LEAKED
    )
    assert judge_probe(p, STOPPED, Outside()).verdict == REFUSED


def test_a_changed_confiner_folder_or_the_sandboxs_word_is_a_leak() -> None:
    p = probe("confiner", value=[1, 2], path="/opt/c")
    assert judge_probe(p, STOPPED, Outside(confiner_after={"/opt/c": [1, 3]})).verdict == LEAKED
    assert judge_probe(p, THROUGH, Outside(confiner_after={"/opt/c": [1, 2]})).verdict == LEAKED
    assert judge_probe(p, STOPPED, Outside(confiner_after={"/opt/c": [1, 2]})).verdict == REFUSED


@pytest.mark.parametrize(
    ("status", "leaked"),
    [
        ({}, False),
        ({"NoNewPrivs": "0"}, True),
        ({"Seccomp": "0"}, True),
        ({"CapEff": "0000000000000001"}, True),
        ({"Uid": "0\t0\t0\t0"}, True),
        ({"Uid": "1000\t1000\t1000\t1000"}, True),  # the owner's own uid
    ],
)
def test_privilege_is_read_from_the_status(status: dict[str, str], leaked: bool) -> None:
    base = {"NoNewPrivs": "1", "Seccomp": "2", "Uid": "2000\t2000\t2000\t2000"}
    base |= dict.fromkeys(("CapInh", "CapPrm", "CapEff", "CapAmb"), "0000000000000000")
    answer = {"outcome": "through", "detail": "", "data": base | status}
    verdict = judge_probe(probe("privilege", value=1000), answer, Outside()).verdict
    assert verdict == (LEAKED if leaked else REFUSED)


def test_a_known_gap_that_got_through_is_a_known_gap_not_a_leak() -> None:
    p = probe("inside", KNOWN_GAP)
    assert judge_probe(p, THROUGH, Outside()).verdict == KNOWN_GAP
    assert judge_probe(p, STOPPED, Outside()).verdict == REFUSED


def test_not_tried_is_reported_as_the_grant_and_says_so() -> None:
    p = Probe("p", "CONNECT x", ALLOWED, None, not_tried="[internet] *")
    finding = judge_probe(p, None, Outside())
    assert (finding.verdict, finding.observed) == (ALLOWED, "not tried: [internet] *")


@pytest.mark.parametrize(
    "answer",
    [None, "through", {"outcome": "fine"}, {"detail": "x"}, ["through"]],
)
def test_a_malformed_or_missing_answer_is_an_incomplete_check(answer: object) -> None:
    with pytest.raises(ProbesFailed):
        judge_probe(probe("inside"), answer, Outside())


def test_results_that_are_not_a_mapping_are_an_incomplete_check() -> None:
    with pytest.raises(ProbesFailed):
        judge_all([probe("inside")], ["x"], Outside())


def test_the_sandboxs_words_reach_the_report_without_control_characters() -> None:
    answer = {"outcome": "stopped", "detail": "\x1b[31mred\x07" + "x" * 500, "data": ""}
    observed = judge_probe(probe("inside"), answer, Outside()).observed
    assert "\x1b" not in observed and "\x07" not in observed
    assert len(observed) <= 160


def test_a_probe_that_failed_itself_fails_the_check_instead_of_reading_as_refused() -> None:
    broken = {"outcome": "error", "detail": "KeyError: 'path'", "data": ""}
    with pytest.raises(ProbesFailed, match="KeyError"):
        judge_probe(probe("inside"), broken, Outside())


@pytest.mark.parametrize(
    ("answer", "kept", "verdict"),
    [
        (STOPPED, True, REFUSED),
        (THROUGH, True, LEAKED),  # it says it truncated: believed, as a worse answer is
        (STOPPED, False, LEAKED),  # the outside saw what was there go
    ],
)
def test_an_append_only_file_that_lost_its_start_is_a_leak(
    answer: dict[str, Any], kept: bool, verdict: str
) -> None:
    assert judge_probe(probe("appended"), answer, Outside(appended_kept=kept)).verdict == verdict


@pytest.mark.parametrize("answer", [STOPPED, THROUGH])
@pytest.mark.parametrize(
    ("bits", "mode", "verdict"),
    [
        (0o6000, 0o104755, LEAKED),  # set-uid left on a file
        (0o6000, 0o102755, LEAKED),
        (0o6000, 0o100755, REFUSED),
        (0o022, 0o100666, LEAKED),  # other users may write it
        (0o022, 0o040775, LEAKED),
        (0o022, 0o040755, REFUSED),
        (0o022, 0o041755, REFUSED),  # sticky alone opens nothing
    ],
)
def test_a_mode_left_after_the_sweep_decides_whatever_the_sandbox_says(
    answer: dict[str, Any], bits: int, mode: int, verdict: str
) -> None:
    p = probe("mode-swept", value=bits, names=("/w/a", "/w/b"))
    assert judge_probe(p, answer, Outside(modes={"/w/b": mode})).verdict == verdict


def test_an_acl_left_on_disk_is_a_leak_and_nothing_made_is_refused() -> None:
    p = probe("mode", value=0o022, names=("/w/a", "/w/b"))
    found = judge_probe(p, STOPPED, Outside(modes={"/w/a": 0o100644}, acls=frozenset({"/w/a"})))
    assert (found.verdict, "ACL" in found.observed) == (LEAKED, True)
    assert judge_probe(p, STOPPED, Outside()).verdict == REFUSED


def test_a_mode_the_sandbox_could_set_is_a_leak_even_when_swept_after() -> None:
    p = probe("mode", value=0o6000, names=("/w/a",))
    assert judge_probe(p, THROUGH, Outside(modes={"/w/a": 0o100755})).verdict == LEAKED
    assert judge_probe(p, STOPPED, Outside(modes={"/w/a": 0o104755})).verdict == LEAKED
    assert judge_probe(p, STOPPED, Outside(modes={"/w/a": 0o100755})).verdict == REFUSED


def test_the_object_judged_bound_at_its_path_is_refused_and_another_is_a_leak() -> None:
    p = probe("identity", value=[64, 1234, 0o040000], path="/home/u/out")
    same = {"outcome": "through", "detail": "looked", "data": [64, 1234, 0o040000]}
    other = {"outcome": "through", "detail": "looked", "data": [64, 999, 0o040000]}
    gone = {"outcome": "stopped", "detail": "ENOENT", "data": ""}
    assert judge_probe(p, same, Outside()).verdict == REFUSED
    leaked = judge_probe(p, other, Outside())
    assert leaked.verdict == LEAKED
    assert "another object than the one judged" in leaked.observed
    assert judge_probe(p, gone, Outside()).verdict == LEAKED  # nothing judged is there


@pytest.mark.parametrize("kind", ["staging", "cmdline"])
def test_what_the_outside_saw_while_it_ran_decides(kind: str) -> None:
    p = probe(kind)
    assert judge_probe(p, STOPPED, Outside(during={kind: "g0 is reachable"})).verdict == LEAKED
    # The sandbox cannot talk its way out, nor into a leak: the outside's look decides.
    assert judge_probe(p, THROUGH, Outside(during={kind: None})).verdict == REFUSED


def test_a_look_that_did_not_happen_is_an_incomplete_check() -> None:
    with pytest.raises(ProbesFailed, match="did not look"):
        judge_probe(probe("staging"), STOPPED, Outside())


def test_a_refusal_that_does_not_say_what_was_judged_is_a_leak() -> None:
    """A hosted model's probe (`plan_hosted`): refused, but its refusal must name the removal."""
    url = "http://127.0.0.1:4001/v1/messages"
    p = probe("wire-said", value=(url, "removed tool 'web_search_20250305'"))
    said = f"{url} model-name: 'm' is not in the rule's models (judged: removed tool "
    judged = Outside(wire_refused=frozenset({said + "'web_search_20250305')"}))
    assert judge_probe(p, STOPPED, judged).verdict == REFUSED
    kept = Outside(wire_refused=frozenset({f"{url} model-name: kept every tool"}))
    assert judge_probe(p, STOPPED, kept).verdict == LEAKED
    other = Outside(wire_refused=frozenset({said.replace("4001", "4000") + "'web_search_2"}))
    assert judge_probe(p, STOPPED, other).verdict == LEAKED


def test_a_listing_that_names_a_model_the_rule_does_not_allow_is_a_leak() -> None:
    """A local model rule's listing probe (`plan_models`): the answer itself decides, whatever
    the probe's outcome; a refusal or an unreadable answer named nothing."""
    rule = parse_model_table({"kind": "ollama", "models": ["m"]}, Origin("t", "models"))
    p = probe("listing", value=rule, path="/api/tags")
    bait = '{"models": [{"name": "m"}, {"name": "bait\u202e:7b"}]}'
    found = judge_probe(p, {**STOPPED, "data": bait}, Outside())
    assert found.verdict == LEAKED
    assert "bait\\u202e:7b" in found.observed and "does not allow" in found.observed
    cut = '{"models": [{"name": "m", "model": "m"}]}'
    assert judge_probe(p, {**THROUGH, "data": cut}, Outside()).verdict == REFUSED
    assert judge_probe(p, {**THROUGH, "data": "502 bad gateway"}, Outside()).verdict == REFUSED
    many = '{"models": [' + ",".join(f'{{"name": "x{i}"}}' for i in range(5)) + "]}"
    assert "and 2 more" in judge_probe(p, {**STOPPED, "data": many}, Outside()).observed


@pytest.mark.parametrize(
    ("times", "verdict"),
    [
        ({"deep": [0.02, 0.012, 0.5], "flat": [0.011, 0.3, 0.01]}, REFUSED),  # ~1.2x: one pass
        ({"deep": [1.9, 1.6, 2.4], "flat": [0.04, 0.9, 0.03]}, LEAKED),  # ~53x: per level
        ({"deep": [0.2, 0.2], "flat": [0.0, 0.0]}, LEAKED),  # nothing to divide by: far past
        ({"deep": [], "flat": [0.01]}, LEAKED),  # no times: never counted as refused
        ({"deep": [0.1], "flat": ["x"]}, LEAKED),
        ("0.1", LEAKED),
    ],
)
def test_the_nesting_costs_ratio_of_least_times_decides(times: object, verdict: str) -> None:
    p = probe("cost", value=5.0)
    answer = {"outcome": "stopped", "detail": "403", "data": times}
    found = judge_probe(p, answer, Outside())
    assert found.verdict == verdict, found
    if verdict == LEAKED and isinstance(times, dict) and times["deep"] == [1.9, 1.6, 2.4]:
        assert "53.3x" in found.observed and "level by level" in found.observed
