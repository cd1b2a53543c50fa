"""Search power (harness/search: coverage, swarm, corpus, shrink passes): each
feature detector on a hand-built trace, swarm knobs obeyed and deterministic,
seed-corpus prefixes really started from, nightly's coverage and learned
corpus, and the CLI's --coverage / --seed-corpus."""

import json

import pytest
from hypothesis import Phase, seed, settings
from hypothesis.stateful import run_state_machine_as_test

from harness.cli import main
from harness.core.session import Session
from harness.core.trace import Trace
from harness.search import profiles
from harness.search.coverage import Tracker, features_of

FEATURES = features_of(None)  # the block-table features (token-slot ones: test_token_slots)
from harness.search.machine import BlockFuzzMachine, make_machine
from harness.search.shrink import _drop_chunks
from reference import RunnerConfig

V1 = RunnerConfig(runner="v1", cudagraph_capture_sizes=(1, 2, 4))


def _features(config, ops):
    """Feature ids hit by each op of ``ops`` replayed on the reference + gpu_impl."""
    session, tracker, hits = Session(config), Tracker(config), []
    for op in ops:
        tracker.before(op, session.ledger, session.reference)
        assert session.apply(op) == []
        hits.append(set(tracker.after(op, session.reference)))
    return hits


def _step(reqs, mode="FULL"):
    return {"op": "step", "scheduled": [[r, 1] for r in reqs], "cudagraph_mode": mode}


def test_each_feature_detector_fires_where_its_situation_happens():
    ops = [{"op": "add", "req": 0, "blocks": [[1], [2]], "prompt_len": 1},
           {"op": "add", "req": 1, "blocks": [[3], [4]], "prompt_len": 1},
           {"op": "add", "req": 2, "blocks": [[5], [6]], "prompt_len": 1},
           {"op": "kv_load", "req": 0}, {"op": "kv_load", "req": 1},  # prior state: the
           {"op": "kv_load", "req": 2},                    # next tokens are decodes
           _step([0, 1, 2]),                                # 6: FULL, padded to 4
           _step([0, 1]),                                   # 7: FULL 2 after 4
           {"op": "remove", "req": 0},                      # 8: row 0 vacated
           {"op": "dummy_run", "num_reqs": 1, "num_tokens": 1, "cudagraph_mode": "FULL"},
           {"op": "add", "req": 3, "blocks": [[1], [2]], "prompt_len": 1},  # 10: reuse
           {"op": "kv_load", "req": 3},
           _step([3, 1, 2]),                                # 12: FULL 4 after 1; padded row
           {"op": "condense"},
           {"op": "dummy_run", "num_reqs": 2, "num_tokens": 2, "cudagraph_mode": "NONE"}]
    hits = _features(V1, ops)
    assert {"forward:FULL:v1:attention", "forward:FULL:v1:mamba"} <= hits[6]
    assert {"full-replay-after-larger", "full-step-after-larger-step",
            "batch-down-across-full"} <= hits[7]
    assert "dummy-after-remove" in hits[9] and "full-replay-after-larger" in hits[9]
    assert {"freed-block-reused", "row-vacated-reused"} <= hits[10]
    assert {"full-replay-after-smaller", "batch-up-across-full",
            "loaded-next-to-padded"} <= hits[12]
    assert "full-step-after-larger-step" not in hits[12]  # a larger batch
    assert {"dummy-after-condense", "forward:NONE:v1:mamba"} <= hits[14]
    assert not hits[0] and not hits[8]  # an add / a remove alone hit nothing
    assert set().union(*hits) <= set(FEATURES)


def test_block_reuse_outside_the_window_is_not_counted():
    ops = [{"op": "add", "req": 0, "blocks": [[1], [2]], "prompt_len": 1},
           {"op": "remove", "req": 0}]
    ops += [{"op": "dummy_run", "num_reqs": 1, "num_tokens": 1, "cudagraph_mode": "NONE"}
            for _ in range(4)]
    ops += [{"op": "add", "req": 2, "blocks": [[1], [2]], "prompt_len": 1}]
    assert "freed-block-reused" not in _features(V1, ops)[-1]  # freed 5 ops before
    assert "freed-block-reused" in _features(V1, ops[:2] + ops[3:])[-1]  # 4 ops before


def _run(machine, n, s=0):
    seed(s)(machine)
    run_state_machine_as_test(machine, settings=settings(
        profiles.get("ci"), max_examples=n, phases=[Phase.generate]))


def _recording(out):
    class Recording(BlockFuzzMachine):
        def teardown(self):
            if getattr(self, "session", None) is not None:
                out.append((self.swarm, self.cfg, list(self.ops)))
            super().teardown()
    return Recording


def test_swarm_knobs_are_obeyed_and_the_draw_is_a_function_of_the_seed():
    first, again = [], []
    _run(make_machine(None, target="reference", base=_recording(first)), 25)
    _run(make_machine(None, target="reference", base=_recording(again)), 25)
    assert [ops for _, _, ops in first] == [ops for _, _, ops in again]
    assert len({repr(sw) for sw, _, _ in first}) > 5  # examples differ in their mix
    for sw, _, ops in first:
        modes = {op["cudagraph_mode"] for op in ops if "cudagraph_mode" in op}
        assert modes <= set(sw.modes)
        assert sw.weight("add") >= 1 and sw.weight("step") >= 1


def test_pick_draws_ops_in_proportion_to_their_weights():
    from types import SimpleNamespace

    from harness.search.swarm import EAGER_FACTOR, FORWARD_FACTOR, Swarm, pick

    class Fixed:  # stands in for the machine's Draws: returns the k it is given
        def __init__(self, k):
            self.k = k

        def integer(self, lo, hi):
            assert lo <= self.k <= hi
            return self.k

    ops = [SimpleNamespace(name=n, forward=f, eager=None)
           for n, f in (("add", None), ("remove", None), ("step", "real"))]
    sw = Swarm(weights={"add": 1, "remove": 0, "step": 3})
    picked = [pick(ops, sw, Fixed(k)).name for k in range(1 + 3 * FORWARD_FACTOR)]
    assert picked == ["add"] + ["step"] * 3 * FORWARD_FACTOR  # remove is off
    only_off = [pick(ops[1:2], sw, Fixed(0)).name]  # nothing else enabled: it still runs
    assert only_off == ["remove"]
    # An op the engine would take now (eager) is drawn EAGER_FACTOR times as often,
    # only while its predicate holds on the machine; a weight of 0 stays off.
    due = {"now": True}
    ops[0].eager = ops[1].eager = lambda m: m["now"]
    picked = [pick(ops, sw, Fixed(k), due).name
              for k in range(EAGER_FACTOR + 3 * FORWARD_FACTOR)]
    assert picked == ["add"] * EAGER_FACTOR + ["step"] * 3 * FORWARD_FACTOR
    due["now"] = False
    assert pick(ops, sw, Fixed(1), due).name == "step"


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_values_kept_across_ledger_keeping_ops_equal_fresh_ones(runner):
    """``per_state`` keeps a value across ops that keep the ledger (a dummy run,
    condense, swap): each kept value and the enabled ops equal what is worked
    out afresh, and such an op leaves the ledger's pickled state as it was."""
    import pickle

    from harness.core.ops import spec_of

    seen = {"reused": 0, "kept_ops": 0}

    class Paranoid(BlockFuzzMachine):
        def per_state(self, name, compute):
            memo_key, memo = self._state_memo
            seen["reused"] += memo_key == self._ledger_version and name in memo
            kept = super().per_state(name, compute)
            assert kept == compute(), name
            return kept

        def enabled_ops(self, weighted=False):
            got = super().enabled_ops(weighted)
            assert got == [s for s in (self._weighted if weighted else self._drawable)
                           if s.enabled(self)]
            return got

        def do(self, op):
            keeps = spec_of(op).keeps_ledger
            before = pickle.dumps(self.ledger) if keeps else None
            super().do(op)
            if keeps:
                seen["kept_ops"] += 1
                assert pickle.dumps(self.ledger) == before, op

    _run(make_machine(None, target="reference", base=Paranoid, runner=runner), 30)
    assert seen["kept_ops"] > 100 and seen["reused"] > 100, seen


def test_uniform_mix_without_swarm():
    drawn = []
    _run(make_machine(None, target="reference", base=_recording(drawn), swarm=False), 5)
    assert {repr(sw) for sw, _, _ in drawn} == {repr(drawn[0][0])}
    assert drawn[0][0].modes == ("FULL", "PIECEWISE", "NONE")


def test_examples_start_from_seed_corpus_traces():
    prefix = [{"op": "add", "req": 7, "blocks": [[5], [6]], "prompt_len": 3},
              _step([7], "PIECEWISE")]
    corpus = [Trace(RunnerConfig(runner="v2"), prefix)]
    drawn = []
    _run(make_machine(None, target="reference", base=_recording(drawn),
                      seed_corpus=corpus), 20)
    started = [ops for _, cfg, ops in drawn if ops[:2] == prefix]
    assert started and len(started) < len(drawn)  # some examples, not all
    for ops in started:  # new requests never reuse the corpus's ids
        assert all(op["req"] > 7 for op in ops[2:] if op["op"] == "add")


def test_usable_drops_traces_a_run_cannot_express():
    from harness.search.corpus import usable

    v1, v2 = Trace(RunnerConfig(runner="v1"), []), Trace(RunnerConfig(runner="v2"), [])
    assert usable([v1, v2], runner="v2") == [v2]
    assert usable([v1, v2], config=RunnerConfig(runner="v1")) == [v1]
    assert usable([v1, v2]) == [v1, v2]


def test_chunk_pass_removes_halves_then_quarters_first_first_keeping_the_failing_op():
    ops = [{"op": "condense", "i": i} for i in range(9)]  # op 8 is the failing one
    cands = [(pos, [o["i"] for o in c]) for pos, c in _drop_chunks(ops)]
    assert [c for _, c in cands[:2]] == [[4, 5, 6, 7, 8], [0, 1, 2, 3, 8]]
    assert cands[2][1] == [2, 3, 4, 5, 6, 7, 8] and len(cands) == 2 + 4
    assert all(c[-1] == 8 for _, c in cands)
    # Positions grow along the pass: after a cut it goes on from where it was.
    assert [p for p, _ in cands] == sorted(p for p, _ in cands)


def test_fuzz_coverage_flag_prints_every_feature(capsys):
    assert main(["fuzz", "--seed", "0", "--examples", "3", "--runner", "v2",
                 "--coverage"]) == 0
    out = capsys.readouterr().out
    assert "behaviour coverage: seed 0" in out
    for f in ("loaded-next-to-padded", "forward:FULL:v2:mamba"):
        assert f in out
    from harness.search.coverage import reachable

    total = len(reachable("v2"))
    assert total < len(FEATURES)  # V1-only features and V1 forwards are not counted
    assert f"/{total} reachable features hit" in out


def test_coverage_counts_only_what_a_pinned_config_can_reach():
    from harness.search.coverage import reachable
    from reference import RunnerConfig

    plain = set(reachable("v1", RunnerConfig()))
    assert "forward:FULL:v1:mamba" in plain and "prefix-hit" not in plain
    assert "spec-tokens-rejected" not in plain and "mamba-state-restored" not in plain
    align = set(reachable("v2", RunnerConfig(runner="v2", allocator="engine",
                                             enable_prefix_caching=True)))
    assert {"prefix-hit", "mamba-state-restored", "allocation-refused"} <= align
    assert "window-hit" not in align and "loaded-next-to-padded" not in align
    assert set(reachable()) == set(FEATURES)  # geometry drawn: everything is reachable


@pytest.mark.parametrize("make", ["missing", "empty", "bad"])
def test_bad_seed_corpus_is_one_line_exit_2(tmp_path, capsys, make):
    path = tmp_path / "corpus"
    if make != "missing":
        path.mkdir()
    if make == "bad":
        (path / "a.json").write_text('{"format": "blockfuzz-trace"}')
    assert main(["fuzz", "--examples", "1", "--seed-corpus", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(path) in err


def test_nightly_reports_coverage_and_learns_a_seed_corpus(tmp_path, capsys):
    first, second = tmp_path / "a", tmp_path / "b"
    base = ["nightly", "--time-budget", "600", "--max-seeds", "1", "--corpus", "",
            "--runner", "v1", "--examples-per-seed", "4"]
    assert main(base + ["--out", str(first)]) == 0
    report = json.loads((first / "report.json").read_text())
    assert set(report["coverage"]) == set(FEATURES)
    hit = [f for f, n in report["coverage"].items() if n["ops"]]
    pinned_away = {f for f in FEATURES if f.startswith("forward:") and ":v2:" in f}
    assert hit and set(report["coverage_unhit"]) == set(FEATURES) - set(hit) - pinned_away
    learned = sorted((first / "learned").glob("prefix-*.json"))
    assert learned and len(learned) == len(report["learned"]["prefixes"])
    assert "learned:" in capsys.readouterr().out
    # The next campaign starts from them: snapshot, settings, rerun commands.
    assert main(base + ["--out", str(second), "--seed-corpus", str(first / "learned")]) == 0
    report = json.loads((second / "report.json").read_text())
    snapshot = second / "seed-corpus"
    assert len(list(snapshot.glob("*.json"))) == len(learned)
    assert report["seed_corpus"] == str(snapshot)
    # Resuming with another seed corpus is refused (the seeds would mix corpora).
    assert main(base + ["--out", str(second)]) == 2


def test_shrinker_folds_a_request_into_another_keeping_the_batch_size():
    """Three one-token requests of a four-token step are one request of four
    tokens to the bug (the padded dummy tail needs four written slots)."""
    from harness.core.session import replay
    from harness.search.shrink import shrink

    config = RunnerConfig.from_json({
        "runner": "v2", "cudagraph_capture_sizes": [4], "max_num_batched_tokens": 4,
        "max_num_blocks_per_req": 1, "max_num_reqs": 3, "num_blocks": 4,
        "groups": [{"kind": "attention", "block_size": 16},
                   {"kind": "attention", "block_size": 4}]})
    ops = [{"op": "add", "req": r, "blocks": [[r + 1], [r + 1]], "prompt_len": 1}
           for r in range(3)]
    ops += [{"op": "step", "scheduled": [[2, 1], [1, 1], [0, 2]], "cudagraph_mode": "NONE"},
            {"op": "dummy_run", "num_reqs": 3, "num_tokens": 3, "cudagraph_mode": "PIECEWISE"}]
    fault = ["dummy-slots-partial-fill"]
    trace = Trace(config, ops, meta={"faults": fault})
    verdict = replay(trace, fault)
    assert verdict.violation is not None
    small, _ = shrink(trace, verdict.violation.invariant, fault)
    assert [op["op"] for op in small.ops] == ["add", "step", "dummy_run"]
    # One request left (the fold); its token count then bisected as low as still fails.
    assert [r for r, _ in small.ops[1]["scheduled"]] == [0]
    assert replay(small, fault).violation.invariant == verdict.violation.invariant


def test_unhit_leaves_out_what_a_pinned_runner_cannot_hit():
    from harness.search.coverage import unhit

    assert "dummy-after-swap" in unhit({}) and "dummy-after-swap" in unhit({}, "v1")
    assert "dummy-after-swap" not in unhit({}, "v2")
    assert "forward:FULL:v1:mamba" not in unhit({}, "v2")
    assert "forward:FULL:v2:mamba" in unhit({}, "v2")


def test_prompt_all_cached_fires_only_for_a_prompt_in_cached_full_blocks():
    from reference import GroupSpec

    cfg = RunnerConfig(groups=(GroupSpec("attention", 4, 4),), num_blocks=12, max_num_reqs=4,
                       max_num_blocks_per_req=4, max_num_batched_tokens=16,
                       allocator="engine", enable_prefix_caching=True)

    def admit(req, n, new, prefix=()):
        return {"op": "admit", "req": req, "prompt_len": n, "prefix": list(prefix),
                "num_new_tokens": new}

    first = [admit(0, 8, 8), {"op": "step", "scheduled": [[0, 8]], "cudagraph_mode": "NONE"}]
    whole = _features(cfg, first + [admit(1, 8, 4, (0, 8))])[-1]
    longer = _features(cfg, first + [admit(1, 9, 1, (0, 8))])[-1]
    assert "prompt-all-cached" in whole and "prefix-hit" in whole
    assert "prompt-all-cached" not in longer and "prefix-hit" in longer


def _steered_run(steering=True, examples=100, s=3):
    """(config, ops, prefix length) per example of a chunked search on the reference."""
    from harness.search.fuzz import _run_chunks

    class Recording(BlockFuzzMachine):
        def teardown(self):
            if getattr(self, "session", None) is not None:
                self.stats.setdefault("rec", []).append(
                    (self.cfg, list(self.ops), self.prefix_len))
                self.stats.setdefault("start_keys", []).append(self.start_key)
                self.stats.setdefault("config_pools", []).append(
                    [t.meta["steer_key"] for t in self.stats.get("steer_configs_pool", [])])
            super().teardown()

    stats, chunks = {}, []
    _run_chunks(None, s, examples, (), "reference", None, None, "dev", stats, None, chunks,
                base=Recording, steering=steering)
    return stats["rec"], chunks, stats


def test_steering_starts_examples_from_earlier_examples_rarest_prefixes():
    from harness.search import fuzz, steer

    rec, chunks, stats = _steered_run()
    assert len(chunks) == -(-100 // fuzz.STEER_CHUNK)  # a Hypothesis run per chunk
    steered = [(i, cfg, ops, n) for i, (cfg, ops, n) in enumerate(rec) if n]
    assert steered and len(steered) < len(rec) // 2  # some examples, not most
    for i, cfg, ops, n in steered:  # the prefix of an earlier example, on its config
        assert any(c == cfg and o[:n] == ops[:n] for c, o, _ in rec[:i]), i
        assert i >= fuzz.STEER_CHUNK  # the first chunk has no pool yet
    # Every key hit has its count and the shortest prefix that hit it.
    table = stats["steer"]
    assert all(e[0] >= 1 and (e[2] is None or len(e[2]) <= steer.MAX_PREFIX_OPS)
               for e in table.values())
    assert {k.rsplit("@", 1)[1] for k in table} <= {"v1", "v2", "v1+mamba", "v2+mamba"}
    again, _, _ = _steered_run()
    assert [(c, o, n) for c, o, n in again] == [(c, o, n) for c, o, n in rec]


def test_steering_gives_rare_pairs_of_config_traits_more_examples():
    from harness.search import fuzz, steer

    # Seed 4: since narrow rows were drawn (2026-12-03), seed 3's config-pool picks
    # all took frontier configs ("towards:" keys), so it showed no "cfg:" start.
    rec, _, stats = _steered_run(s=4)
    by_config = [(i, k) for i, k in enumerate(stats["start_keys"]) if k and k.startswith("cfg:")]
    assert by_config and len(by_config) < len(rec) // 4
    for i, k in by_config:
        cfg, _, n = rec[i]
        assert n == 0 and i >= fuzz.STEER_CHUNK  # a config only, from the second chunk on
        assert k in stats["config_pools"][i]  # one of the least-run pairs when its chunk began
        assert set(k[len("cfg:"):].split("+")) <= set(steer.traits(cfg))
        assert any(c == cfg for c, _, _ in rec[:i])  # an earlier example's config
    # Every pair is counted once per example whose config has it.
    for k, (n, _) in stats["steer_configs"].items():
        if not k.startswith(steer.TOWARDS):
            assert n == sum(k in steer.config_keys(c) for c, _, _ in rec), k


def test_config_traits_pair_the_mechanisms_a_config_turns_on():
    from harness.search import steer
    from reference import GroupSpec

    cfg = RunnerConfig(runner="v2", groups=(GroupSpec("attention", 4, 4, sliding_window=5),),
                       allocator="engine", enable_prefix_caching=True,
                       num_speculative_tokens=1, max_num_blocks_per_req=8)
    assert steer.traits(cfg) == ["attention-only", "drafter", "engine-allocator",
                                 "prefix-caching", "v2", "window"]
    assert "cfg:drafter+window" in steer.config_keys(cfg)
    assert len(steer.config_keys(cfg)) == 15
    stats = {}
    steer.learn_config(stats, cfg)
    steer.learn_config(stats, RunnerConfig(runner="v2"))
    steer.learn_config(stats, RunnerConfig(runner="v2"))
    rare = steer.rarest_configs(stats)
    assert len(rare) == steer.RAREST and all(not t.ops for t in rare)
    once = {k for k, e in stats["steer_configs"].items() if e[0] == 1}
    frontier = {k for k in once if k.startswith(steer.TOWARDS)}  # window-hit(-drafter)@v2
    assert len(once - frontier) == 15 and len(frontier) == 2
    assert {t.meta["steer_key"] for t in rare} < once
    assert stats["steer_configs"]["cfg:mamba+v2"][0] == 2
    assert rare[0].config == cfg


def test_drawn_prefix_caching_configs_hold_prompts_longer_than_two_prefix_units():
    """A hit is a multiple of the prefix unit and never the whole prompt (and
    with a drafter loses its last block): rows that hold one unit (a 16-token
    Mamba state block beside 4-token attention blocks, 4 columns) would make
    every hit impossible; a window hit also needs the hit past the window."""
    from hypothesis import HealthCheck, given

    from harness.search.geometry import row_tokens_max, runner_configs

    @settings(max_examples=1000, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(runner_configs())
    def check(cfg):
        if cfg.enable_prefix_caching:
            units = 2 + (cfg.num_speculative_tokens > 0)  # a drafter's hit drops a block
            window = max(g.sliding_window or 0 for g in cfg.groups)  # a window hit passes it
            assert cfg.max_model_len >= min(window + units * cfg.prefix_unit + 1,
                                            row_tokens_max(cfg.groups)), cfg

    check()


def test_no_steering_starts_nothing_from_a_prefix():
    rec, _, _ = _steered_run(steering=False, examples=60)
    assert not any(n for _, _, n in rec)


def test_rarest_orders_keys_by_examples_then_a_hash_that_moves_on():
    from harness.search import steer

    stats = {}
    cfg = RunnerConfig(runner="v1")  # hybrid: keys carry +mamba
    op = {"op": "add", "req": 0, "blocks": [[1], [2]], "prompt_len": 1}
    steer.learn(stats, cfg, [op, op], {"a": 1, "b": 0})
    steer.learn(stats, cfg, [op], {"b": 0})
    keys = [t.meta["steer_key"] for t in steer.rarest(stats)]
    assert keys == ["a@v1+mamba", "b@v1+mamba"]
    assert [len(t.ops) for t in steer.rarest(stats)] == [2, 1]
    # Ties: which of many once-hit keys make the pool changes as examples go by.
    for f in "cdefghijklmn":
        steer.learn(stats, cfg, [op], {f: 0})
    pools = set()
    for n in range(0, 200, 50):
        stats["examples"] = n
        pool = [t.meta["steer_key"] for t in steer.rarest(stats)]
        assert "b@v1+mamba" not in pool and len(pool) == steer.RAREST  # b: hit twice
        pools.add(tuple(pool))
    assert len(pools) > 1


def test_prefix_resourcing_moves_a_shared_prefix_only_to_later_lenders():
    from harness.search.shrink import _resource_prefixes

    def admit(req, n, prefix=()):
        return {"op": "admit", "req": req, "prompt_len": n, "prefix": list(prefix),
                "num_new_tokens": 1, "blocks": [[1]], "num_cached_tokens": 0}

    ops = [admit(0, 16), admit(1, 8, (0, 8)), admit(2, 24, (0, 24)), admit(3, 4, (2, 4))]
    got = [[op["prefix"] for op in cand] for _, cand in _resource_prefixes(ops)]
    # req 1 and req 2 may borrow from a request admitted after their lender and before
    # them (req 2 from req 1, up to req 1's 8 tokens); req 3's lender is the last one.
    assert got == [[[], [0, 8], [1, 8], [2, 4]]]
    assert all("blocks" not in cand[2] for _, cand in _resource_prefixes(ops))  # re-recorded


def test_examples_are_drawn_afresh_not_copies_of_earlier_ones(monkeypatch):
    """Hypothesis's own backend follows each new example with copies of it
    (spans duplicated) and opens runs with all-simplest draws; the search's
    backend draws every example afresh (profiles.FreshExamples)."""
    def openings(rec):
        return len({(json.dumps(c.to_json(), sort_keys=True), json.dumps(o[:5], sort_keys=True))
                    for c, o, _ in rec})

    rec, _, _ = _steered_run(steering=False, examples=50)
    assert len(rec) == 50 and openings(rec) >= 48  # a chance repeat or two at most
    monkeypatch.setattr(profiles, "SEARCH_BACKEND", "hypothesis")  # the engine's own
    copied, _, _ = _steered_run(steering=False, examples=50)
    # What the check above guards against (40 here: the engine's mutator copies spans).
    assert openings(copied) < 45


def _corpus_features(name, **config_changes):
    """Features each op of corpus trace ``name`` hits on the reference, with its
    config changed by ``config_changes`` (the targets' recorded choices dropped)."""
    from pathlib import Path

    from harness.core.ops.scheduler import without_recorded
    from harness.core.trace import load

    t = load(Path(__file__).resolve().parents[2] / "corpora" / "seeds" / f"{name}.json")
    fields = t.config.to_json() | config_changes
    config = RunnerConfig.from_json(fields)
    session, tracker, hits = Session(config, (), "reference"), Tracker(config), set()
    for op in t.ops:
        op = without_recorded(op) if config_changes else op
        tracker.before(op, session.ledger, session.reference)
        session.apply(op)
        hits |= set(tracker.after(op, session.reference))
    return hits


def test_narrow_hit_features_fire_only_in_the_config_that_makes_them():
    eagle = "sliding-window-eagle-drop-unextended"
    assert {"window-hit", "window-hit-drafter"} <= _corpus_features(eagle)
    plain = _corpus_features(eagle, num_speculative_tokens=0)
    assert "window-hit" in plain and "window-hit-drafter" not in plain
    align = "mamba-align-seed-attention-block-size"
    assert {"mamba-state-restored", "mamba-state-restored-larger-block"} <= \
        _corpus_features(align)
    same = _corpus_features(align, groups=[{"block_size": 8, "kernel_block_size": 8,
                                            "kind": "attention"},
                                           {"block_size": 8, "kernel_block_size": 8,
                                            "kind": "mamba"}])
    assert "mamba-state-restored" in same and "mamba-state-restored-larger-block" not in same


def test_steering_keeps_a_frontier_towards_features_not_hit_yet():
    """An example that got a prefix hit in a window + drafter config without a
    window hit is the frontier towards window-hit-drafter until one is hit."""
    from harness.search import steer
    from harness.search.coverage import NARROWS
    from harness.core.trace import load
    from pathlib import Path

    t = load(Path(__file__).resolve().parents[2] / "corpora" / "seeds"
             / "sliding-window-eagle-drop-unextended.json")
    assert NARROWS["window-hit-drafter"] == "prefix-hit"
    stats: dict = {}
    many = [{"op": "dummy_run", "num_reqs": 1, "num_tokens": 1, "cudagraph_mode": "NONE"}]
    for i in range(8):  # eight ordinary keys, each hit once: rarer than nothing else
        steer.learn(stats, t.config, many * (i + 1), {f"forward:NONE:v1:x{i}": i})
    steer.learn(stats, t.config, t.ops, {"prefix-hit": 2})  # got as far as the hit
    towards = steer.TOWARDS + steer.key("window-hit-drafter", t.config)
    assert stats["steer"][towards][0] == 1 and stats["steer"][towards][2] == t.ops[:3]
    assert steer.TOWARDS + steer.key("window-hit", t.config) in stats["steer"]
    pool = [p.meta["steer_key"] for p in steer.rarest(stats)]
    assert towards in pool and len(pool) == steer.RAREST
    assert sum(k.startswith(steer.TOWARDS) for k in pool) <= steer.FRONTIER
    steer.learn(stats, t.config, t.ops, {"prefix-hit": 2, "window-hit": 2,
                                        "window-hit-drafter": 2})  # now hit
    assert stats["steer"][towards][0] == 1  # no longer counted as short of it
    pool = [p.meta["steer_key"] for p in steer.rarest(stats)]
    assert not any(k.startswith(steer.TOWARDS) for k in pool)  # hit: the frontier is gone


def test_steering_offers_configs_where_a_feature_not_hit_yet_is_reachable():
    from harness.search import steer
    from harness.core.trace import load
    from pathlib import Path

    t = load(Path(__file__).resolve().parents[2] / "corpora" / "seeds"
             / "sliding-window-eagle-drop-unextended.json")
    stats: dict = {}
    for _ in range(3):
        steer.learn_config(stats, V1)  # no window: neither narrow window feature reachable
    steer.learn_config(stats, t.config)  # window + drafter + caching
    towards = steer.TOWARDS + steer.key("window-hit-drafter", t.config)
    assert stats["steer_configs"][towards] == [1, t.config]
    assert steer.TOWARDS + steer.key("window-hit", t.config) in stats["steer_configs"]
    assert not any(k.startswith(steer.TOWARDS + "mamba-state-restored")
                   for k in stats["steer_configs"])  # no align config learned: not reachable
    pool = [p.meta["steer_key"] for p in steer.rarest_configs(stats)]
    assert towards in pool and sum(k.startswith(steer.TOWARDS) for k in pool) <= steer.FRONTIER
    stats["steer"] = {steer.key("window-hit-drafter", t.config): [1, t.config, t.ops]}  # hit
    pool = [p.meta["steer_key"] for p in steer.rarest_configs(stats)]
    assert towards not in pool


def test_frontier_pool_offers_the_prefix_where_one_is_kept_else_the_config():
    """While a narrow feature is not hit, the frontier pool (its own share of
    examples) holds its frontier: the bare config where it is reachable, then
    the prefix that reached its broader feature once there is one; hit, it is
    gone."""
    from harness.search import steer
    from harness.core.trace import load
    from pathlib import Path

    t = load(Path(__file__).resolve().parents[2] / "corpora" / "seeds"
             / "sliding-window-eagle-drop-unextended.json")
    stats: dict = {}
    assert steer.frontier(stats) == []
    steer.learn_config(stats, t.config)
    towards = steer.TOWARDS + steer.key("window-hit-drafter", t.config)
    pool = {p.meta["steer_key"]: p for p in steer.frontier(stats)}
    assert towards in pool and pool[towards].ops == [] and pool[towards].config == t.config
    steer.learn(stats, t.config, t.ops, {"prefix-hit": 2})  # got as far as the hit
    pool = {p.meta["steer_key"]: p for p in steer.frontier(stats)}
    assert pool[towards].ops == t.ops[:3]
    steer.learn(stats, t.config, t.ops, {"prefix-hit": 2, "window-hit": 2,
                                        "window-hit-drafter": 2})
    assert steer.frontier(stats) == []


def test_hit_requests_run_in_the_next_step_mostly():
    """A request admitted with a prefix hit is in most steps drawn before it
    has run (vLLM schedules an admitted request in the step that admits it),
    not in every one (a step without it stays possible)."""
    from hypothesis import HealthCheck, given, settings, strategies as st
    from harness.core.ops import REGISTRY
    from harness.core.session import Session
    from harness.core.trace import load
    from harness.search import swarm as swarm_mod
    from harness.search.draws import Draws
    from pathlib import Path

    t = load(Path(__file__).resolve().parents[2] / "corpora" / "seeds"
             / "sliding-window-eagle-drop-unextended.json")
    cfg = RunnerConfig.from_json(dict(t.config.to_json(), max_num_reqs=8, num_blocks=64))
    ops = []
    for req in range(6):  # six running requests, request 0 the prefix source
        ops += [{"op": "admit", "req": req, "prompt_len": 8, "prefix": [], "num_new_tokens": 8},
                {"op": "step", "scheduled": [[req, 8]], "cudagraph_mode": "NONE"}]
    ops.append({"op": "admit", "req": 6, "prompt_len": 10, "prefix": [0, 8],
                "num_new_tokens": 2})  # the last in every order a draw starts from
    session = Session(cfg, (), "reference", record=True)
    for op in ops:
        assert not session.apply(op)
    assert session.ledger.requests[6].num_cached_tokens > 0  # a prefix hit
    ran = []

    class M:  # what a step's draw reads of the machine
        swarm = swarm_mod.DEFAULT

    M.cfg, M.session, M.ledger = cfg, session, session.ledger

    @settings(max_examples=60, database=None, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def draw(data):
        ran.append(any(r == 6 for r, _ in REGISTRY["step"].draw(M(), Draws(data))["scheduled"]))

    draw()
    # 45 of 60 here; without the rule 29 (a request drawn at random).
    assert 0.6 * len(ran) <= sum(ran) < len(ran)


def _fake_fails(monkeypatch, fails):
    """The shrinker's replay replaced by ``fails(trace) -> bool`` (no kernel
    runs); returns the list of traces it was asked about."""
    import harness.search.shrink as shrink_mod

    asked = []

    def fake(trace, invariant, faults, target, device):
        asked.append(trace)
        if not fails(trace):
            return None
        shrink_mod._LAST_OPS[:] = trace.ops
        return len(trace.ops)
    monkeypatch.setattr(shrink_mod, "_fails", fake)
    return asked


def test_shrinker_bisects_an_op_integer_in_log_replays(monkeypatch):
    """An op's token count (its registry entry's ``sizes``) is lowered by
    bisection: a prompt that must keep 37 of 200 tokens gets there in about
    log2(200) replays, not 163 (lowering one at a time)."""
    from harness.search.shrink import _lower_sizes

    cfg = RunnerConfig.from_json({"runner": "v1", "groups": [{"kind": "attention",
                                                              "block_size": 16}],
                                  "num_blocks": 64, "max_num_blocks_per_req": 16})
    ops = [{"op": "add", "req": 0, "blocks": [list(range(1, 14))], "prompt_len": 200}]
    asked = _fake_fails(monkeypatch, lambda t: bool(t.ops) and t.ops[0]["prompt_len"] >= 37)
    best, replays, lowered = _lower_sizes(Trace(cfg, ops), "X", (), "reference", None, 0, set())
    assert lowered and best.ops[0]["prompt_len"] == 37
    assert asked[0].ops[0]["prompt_len"] == 1  # the least value first
    assert replays == len(asked) <= 9


def test_shrinker_bisects_a_config_limit(monkeypatch):
    """A config limit goes to the smallest value the trace stays legal under
    first (dry runs, no replay), then bisects towards the smallest that fails."""
    from harness.search.shrink import _lower_limit

    cfg = RunnerConfig.from_json({"runner": "v1", "groups": [{"kind": "attention",
                                                              "block_size": 4}],
                                  "num_blocks": 64})
    ops = [{"op": "add", "req": 0, "blocks": [[1, 2, 3]], "prompt_len": 9}]
    replays = []

    def fails(config):
        replays.append(config.num_blocks)
        return config.num_blocks >= 57
    config = _lower_limit(Trace(cfg, ops), "num_blocks", fails)
    assert config.num_blocks == 57
    assert replays[0] == 4  # blocks 1..3 and the null block: the least legal pool
    assert len(replays) <= 9
    assert _lower_limit(Trace(cfg, ops), "num_blocks", lambda c: False) is None


def test_shrinker_tries_every_config_simplification_in_one_replay_first(monkeypatch):
    """The config shrink replays the simplest config first (every simpler
    geometry, capture size dropped and limit at its least legal value, dry runs
    deciding legality); a finding that needs none of it takes one config replay,
    and one that needs something falls back to one simplification at a time."""
    from harness.search.shrink import _shrink_config, _simplest_config

    cfg = RunnerConfig.from_json({"runner": "v1", "groups": [{"kind": "attention",
                                                              "block_size": 4,
                                                              "kernel_block_size": 2}],
                                  "num_blocks": 64, "max_num_reqs": 8,
                                  "cudagraph_capture_sizes": [1, 2, 4, 8]})
    ops = [{"op": "add", "req": 0, "blocks": [[1, 2, 3]], "prompt_len": 9}]
    simplest = _simplest_config(cfg, ops)
    assert simplest.num_blocks == 4 and simplest.max_num_reqs == 1
    assert simplest.groups[0].kernel_block_size == 4 and not simplest.cudagraph_capture_sizes
    asked = _fake_fails(monkeypatch, lambda t: True)
    best, replays = _shrink_config(Trace(cfg, ops), "X", (), "reference", None, 0)
    assert best.config == simplest and replays == len(asked) == 1
    # A finding that needs its capture sizes: the one-at-a-time rounds after it.
    asked = _fake_fails(monkeypatch, lambda t: t.config.cudagraph_capture_sizes == (1, 2, 4, 8))
    best, replays = _shrink_config(Trace(cfg, ops), "X", (), "reference", None, 0)
    assert asked[0].config == simplest and best.config.cudagraph_capture_sizes == (1, 2, 4, 8)
    assert best.config.num_blocks == 4 and best.config.groups[0].kernel_block_size == 4


def test_foreign_count_in_the_next_forward_is_narrower_than_a_foreign_count():
    """``spec-count-foreign-next-forward`` (vLLM PR #45100's situation: counts copied
    by row land after the next update moved the rows) fires where the request
    continues from state in the forward right after the one that kept the
    count, and not across a dummy run, whose update empties the batch first."""
    from harness.core.trace import load
    from harness.search.coverage import NARROWS
    from pathlib import Path

    t = load(Path(__file__).resolve().parents[2] / "corpora" / "seeds"
             / "accepted-counts-land-after-condense.json")
    assert NARROWS["spec-count-foreign-next-forward"] == "spec-row-count-foreign"
    last = _features(t.config, t.ops)[-1]
    assert {"spec-row-count-foreign", "spec-count-foreign-next-forward"} <= last
    dummy = {"op": "dummy_run", "num_reqs": 1, "num_tokens": 1, "cudagraph_mode": "NONE"}
    last = _features(t.config, t.ops[:-1] + [dummy, t.ops[-1]])[-1]
    assert "spec-row-count-foreign" in last and "spec-count-foreign-next-forward" not in last


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_a_target_that_cannot_split_blocks_never_draws_a_kernel_block_split(runner):
    """A target whose block tables take no kernel block size (vLLM 0.33's V1
    ``BlockTable``) says so with ``kernel_split``; no drawn config may split a
    block then — neither the first draw nor the attention block a hybrid page
    derives (the ``kv_sharing`` layout sized 4-token blocks of 2-token kernel
    blocks before, and the vllm target crashed on seed 0)."""
    from hypothesis import HealthCheck, given

    from harness.search.geometry import runner_configs

    @settings(max_examples=1500, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(runner_configs(runner, kernel_split={runner: False}))
    def check(cfg):
        assert all(g.kernel_block_size == g.block_size for g in cfg.groups), cfg

    check()


def test_draws_make_the_choices_strategies_make():
    """The machine's Draws (integer, choice, boolean) ask Hypothesis for the
    same choices st.integers / st.sampled_from / st.booleans do, so a seed
    draws the same examples through either (the search's backend draws each
    choice afresh; Hypothesis's own would also mutate spans, which Draws
    does not open)."""
    from hypothesis import given, seed, settings, strategies as st

    from harness.search.draws import Draws

    def script(draw_int, draw_choice, draw_bool):
        return [draw_int(0, 3), draw_int(5, 5), draw_int(-4, 200), draw_int(1, 127),
                draw_choice([7]), draw_choice(["a", "b", "c"]), draw_bool(),
                draw_choice(list(range(300))), draw_int(0, 7)]

    got = {}
    for how in ("strategies", "draws"):
        runs = got.setdefault(how, [])

        @seed(5)
        @settings(profiles.search_settings("dev", 30))  # the search's backend
        @given(st.data())
        def run(data):
            if how == "strategies":
                runs.append(script(lambda a, b: data.draw(st.integers(a, b)),
                                   lambda xs: data.draw(st.sampled_from(xs)),
                                   lambda: data.draw(st.booleans())))
            else:
                d = Draws(data)
                runs.append(script(d.integer, d.choice, d.boolean))

        run()
    assert len(got["draws"]) == 30 and got["draws"] == got["strategies"]
    assert len({repr(r) for r in got["draws"]}) > 20  # the examples differ from each other


def test_an_example_draws_the_same_ops_in_one_hypothesis_step_or_one_per_op(monkeypatch):
    """``machine.run`` puts an example's ops in one Hypothesis step; they come
    from the example's seeded generator, so they are the ops drawn one
    Hypothesis step per op (seeds pinned per example here: the stop choices
    of one step per op read Hypothesis's random stream too)."""
    from harness.search import machine as machine_mod

    search = profiles.search_settings("dev", 4)
    got = {}
    for how in ("one step per op", "one step per example"):
        seeds = iter(range(1000, 1010))
        monkeypatch.setattr(machine_mod, "example_seed", lambda data, salt: next(seeds))
        out = got.setdefault(how, [])
        m = make_machine(V1, target="reference", base=_recording(out), swarm=False,
                         steering=False)
        seed(3)(m)
        if how == "one step per op":
            run_state_machine_as_test(m, settings=search)
        else:
            machine_mod.run(m, search)
    per_op, whole = ([ops for _, _, ops in got[k]] for k in got)
    assert len(whole) == 4 and per_op == whole
    assert all(len(ops) == search.stateful_step_count - 1 for ops in whole)
    assert len({json.dumps(ops) for ops in whole}) == 4  # each seed its own example


def test_example_draws_keep_the_strategies_distributions():
    """``ExampleDraws`` (an example's op draws) draws list lengths with the
    average Hypothesis's ``st.lists(.., unique=True)`` gives, and weights a
    wide integer range's bounds as ``st.integers`` does; a seed replays."""
    import random
    from statistics import mean

    from hypothesis.internal.conjecture.data import ConjectureData

    from harness.search.draws import Draws, ExampleDraws

    class _Data:
        def __init__(self, cd):
            self.conjecture_data = cd

    d = ExampleDraws(7)
    for least, most in ((1, 12), (0, 40), (2, 5)):
        ours = [d.unique_sample(range(40), least, most) for _ in range(3000)]
        theirs = [len(Draws(_Data(ConjectureData(random=random.Random(s)))).unique_sample(
            range(40), least, most)) for s in range(3000)]
        assert all(len(set(x)) == len(x) and set(x) <= set(range(40)) for x in ours)
        assert {len(x) for x in ours} == set(range(least, most + 1)) or most == 40
        assert abs(mean(map(len, ours)) - mean(theirs)) < 0.3, (least, most)
    xs = [d.integer(0, 1000) for _ in range(40000)]
    assert 0.012 < xs.count(0) / len(xs) < 0.022  # 2/128 + a uniform share
    assert 0.012 < xs.count(1000) / len(xs) < 0.022
    assert 0.005 < xs.count(1) / len(xs) < 0.013  # 1/128 + a uniform share
    assert xs.count(500) / len(xs) < 0.004
    assert sorted(d.permutation(range(9))) == list(range(9))
    a, b = ExampleDraws(11), ExampleDraws(11)
    assert [a.integer(0, 9) for _ in range(50)] == [b.integer(0, 9) for _ in range(50)]
    with pytest.raises(TypeError, match="not a strategy"):
        d.draw(None)


def test_the_salt_moves_a_runs_all_simplest_first_example():
    """Hypothesis draws a run's first example all-simplest; the search's salt
    (its seed) still gives that example other ops in another run, and the
    same salt the same ops."""
    from harness.search import machine as machine_mod

    def first(salt):
        out = []
        m = make_machine(V1, target="reference", base=_recording(out), swarm=False,
                         steering=False, salt=salt)
        seed(0)(m)
        machine_mod.run(m, profiles.search_settings("dev", 1))
        return out[0][2]

    assert first(0) == first(0) and first(1) == first(1)
    assert first(0) != first(1)


def test_a_search_settles_the_heap_and_gives_it_back():
    """machine.settled_heap: the start-up heap frozen out of the collector and a
    larger young threshold inside; the program's settings after, and a freeze
    the program made is never thawed by it."""
    import gc

    from harness.search.machine import GEN0_THRESHOLD, settled_heap

    threshold = gc.get_threshold()
    assert gc.get_freeze_count() == 0
    with settled_heap():
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold()[0] == max(threshold[0], GEN0_THRESHOLD)
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == threshold
    gc.freeze()  # the program's own freeze
    try:
        mine = gc.get_freeze_count()
        with settled_heap():
            pass
        assert gc.get_freeze_count() == mine
    finally:
        gc.unfreeze()
