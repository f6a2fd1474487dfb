"""``gpualloc plan`` and ``topo import --bandwidth-matrix`` through the real entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpualloc.placement.policies.registry import policy_names

FIXTURES = Path(__file__).parent / "fixtures"


def test_plan_human_output_lists_ranks_links_and_scores(cli) -> None:
    result = cli("--topology", "dgx1-v100", "plan", "-n", "3")
    assert result.exit_code == 0, result.stderr
    assert "Rank  GPU  NUMA  Link to next rank" in result.stdout
    assert "0     0    0     -> 2: NV1 25 GB/s" in result.stdout
    assert "CUDA_VISIBLE_DEVICES=0,2,3" in result.stdout
    assert "effective 57.9 GB/s (MAPA Table 2)" in result.stdout


def test_plan_json_contract(cli) -> None:
    result = cli("--topology", "dgx1-v100", "plan", "-n", "5", "--json")
    data = json.loads(result.stdout)
    assert data["policy"] == "mapa"
    assert data["gpus"] == [0, 1, 3, 4, 2]
    assert set(data["scores"]) == {
        "aggregated_gbps",
        "effective_gbps",
        "preserved_gbps",
        "bottleneck_gbps",
        "utility",
    }
    assert data["scores"]["effective_gbps"] == pytest.approx(53.608775)
    assert data["numa_nodes"] == [0, 0, 0, 1, 0]


def test_plan_single_gpu_scores_that_do_not_apply_are_null(cli) -> None:
    data = json.loads(cli("--topology", "dgx1-v100", "plan", "-n", "1", "--json").stdout)
    assert data["scores"]["aggregated_gbps"] is None
    assert data["scores"]["effective_gbps"] is None
    assert data["scores"]["bottleneck_gbps"] is None
    assert data["sensitive"] is False


def test_plan_explain_gives_alternatives_and_a_reason(cli) -> None:
    result = cli(
        "--topology",
        "dgx1-v100",
        "plan",
        "-n",
        "2",
        "--insensitive",
        "--busy",
        "0",
        "--explain",
        "--json",
    )
    data = json.loads(result.stdout)
    assert data["explain"]["reason"].startswith("keeps ")
    assert len(data["explain"]["alternatives"]) == 5
    human = cli("--topology", "dgx1-v100", "plan", "-n", "3", "--explain")
    assert "Runners-up under the same objective" in human.stdout
    assert "why: predicted effective bandwidth" in human.stdout


def test_plan_compare_shows_every_policy(cli) -> None:
    result = cli(
        "--topology", "nvlink-pairs-4gpu", "plan", "-n", "2", "--busy", "0", "--compare", "--json"
    )
    rows = {row["policy"]: row["gpus"] for row in json.loads(result.stdout)["compare"]}
    assert list(rows) == policy_names()
    assert rows["slurm"] == [1, 2]
    assert sorted(rows["mapa"]) == [2, 3]


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["-n", "9"], 9, "asks for 9 GPUs"),
        (["-n", "2", "--require", "0", "--busy", "0"], 9, "required GPU 0 is not free"),
        (["-n", "2", "--busy", "x"], 2, "is not a GPU list"),
        (["-n", "2", "--busy", "1", "--free", "2"], 2, "give one"),
        (["-n", "2", "--busy", "12"], 2, "GPU 12 does not exist"),
        (["-n", "2", "--policy", "foo"], 2, "unknown policy 'foo'"),
        (["-n", "2", "--pattern", "nope"], 2, "unknown pattern 'nope'"),
        (["-n", "2", "--score", "x"], 2, "unknown --score"),
        (["-n", "2", "--drb-weights", "1,2"], 2, "three non-negative numbers"),
        (["-n", "0"], 2, "must be at least 1"),  # not pydantic's wording
    ],
)
def test_plan_errors(cli, args: list[str], code: int, message: str) -> None:
    result = cli("--topology", "dgx1-v100", "plan", *args)
    assert result.exit_code == code
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_plan_with_a_pattern_file(cli, tmp_path: Path) -> None:
    pattern = tmp_path / "pipeline.json"
    pattern.write_text(json.dumps({"edges": [[0, 1], [1, 2]]}))
    data = json.loads(
        cli(
            "--topology",
            "dgx1-v100",
            "plan",
            "-n",
            "3",
            "--pattern",
            str(pattern),
            "--policy",
            "mapa-greedy",
            "--json",
        ).stdout
    )
    assert data["scores"]["aggregated_gbps"] == 100
    bad = tmp_path / "bad.json"
    bad.write_text("[[0, 5]]")
    result = cli("--topology", "dgx1-v100", "plan", "-n", "3", "--pattern", str(bad))
    assert result.exit_code == 2
    assert "leaves ranks 0..2" in result.stderr


def test_import_bandwidth_matrix_and_plan_on_it(cli, tmp_path: Path) -> None:
    out = tmp_path / "measured.json"
    matrix = FIXTURES / "bandwidth" / "k8s-proposal-matrix.txt"
    result = cli("topo", "import", "--bandwidth-matrix", str(matrix), "-o", str(out))
    assert result.exit_code == 0, result.stderr
    saved = json.loads(out.read_text())
    assert saved["provenance"]["bandwidth"] == "measured"
    link_1_4 = next(link for link in saved["links"] if (link["a"], link["b"]) == (1, 4))
    assert link_1_4["bandwidth_gbps"] == 4.64
    data = json.loads(
        cli("--topology", str(out), "plan", "-n", "4", "--pattern", "all", "--json").stdout
    )
    assert sorted(data["gpus"]) == [0, 1, 2, 3]
    assert data["scores"]["bottleneck_gbps"] == 48.33


def test_import_bandwidth_matrix_over_topo_m(cli, tmp_path: Path) -> None:
    from tests.recordings import recorded

    topo = tmp_path / "topo.txt"
    topo.write_text(recorded("4gpu_nv4-bridge-pairs_2socket_interleaved-cpus_topo.txt"))
    matrix = tmp_path / "m.json"
    matrix.write_text(json.dumps([[0, 5, 6, 7], [5, 0, 8, 9], [6, 8, 0, 10], [7, 9, 10, 0]]))
    result = cli("topo", "import", str(topo), "--bandwidth-matrix", str(matrix), "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    links = {(link["a"], link["b"]): link for link in data["links"]}
    assert links[(2, 3)]["bandwidth_gbps"] == 10
    assert links[(0, 1)]["kind"].startswith("NV")  # the structure still comes from topo -m
    wrong = tmp_path / "three.json"
    wrong.write_text(json.dumps([[0, 1, 1], [1, 0, 1], [1, 1, 0]]))
    result = cli("topo", "import", str(topo), "--bandwidth-matrix", str(wrong))
    assert result.exit_code == 5
    assert "the bandwidth matrix has 3 GPUs, the topology 4" in result.stderr


def test_import_needs_something(cli) -> None:
    result = cli("topo", "import")
    assert result.exit_code == 2
    assert "nothing to import" in result.stderr


@pytest.mark.parametrize(
    ("args", "model"),
    [
        (("-n", "5"), "mapa"),  # a 5-GPU ring: 5 edges, the most Table 2 was fitted on
        (("-n", "2"), "mapa"),  # a 2-GPU ring counts its pair twice: 2 edges, the fewest
        (("-n", "6"), "bottleneck"),  # 6 edges: Table 2 predicts -3.31 GB/s for (1, 0, 5)
        (("-n", "8"), "bottleneck"),  # 8 edges: -43.3 GB/s for (4, 2, 2)
        (("-n", "2", "--pattern", "all"), "bottleneck"),  # 1 edge: below the fitted range
        (("-n", "8", "--pattern", "all"), "bottleneck"),  # 28 edges: Table 2 says -3434 GB/s
    ],
)
def test_auto_uses_table_2_only_within_its_domain(cli, args: tuple[str, ...], model: str) -> None:
    data = json.loads(cli("--topology", "dgx1-v100", "plan", *args, "--json").stdout)
    assert data["effective_model"] == model and data["scores"]["effective_gbps"] > 0
    forced = json.loads(
        cli("--topology", "dgx1-v100", "plan", *args, "--score", "mapa", "--json").stdout
    )
    assert forced["effective_model"] == model  # asked for, but only within its fitted range
    outside = [note for note in forced["notes"] if "fitted on patterns of 2 to 5 edges" in note]
    assert bool(outside) == (model == "bottleneck"), forced["notes"]


@pytest.mark.parametrize("k", range(2, 9))
@pytest.mark.parametrize("host", ["dgx1-v100", "dgx1-p100"])
def test_no_predicted_bandwidth_is_negative(cli, host: str, k: int) -> None:
    """Table 2 outside its fitted range scored a DGX-1 ring of 8 at -43.3 GB/s and a 7-GPU
    placement of --compare at -16.2; every policy's every score is now a bandwidth."""
    for sensitivity in ("--sensitive", "--insensitive"):
        data = json.loads(
            cli("--topology", host, "plan", "-n", str(k), sensitivity, "--compare", "--json").stdout
        )
        for placement in data["compare"]:
            assert placement["scores"]["effective_gbps"] > 0, placement


def test_a_sensitive_6_gpu_ring_on_a_dgx1_stays_on_nvlink(cli) -> None:
    """Table 2 extrapolated to 6 edges picked 0,1,3,4,2,6, whose ring crosses a PCIe (SYS)
    link, although an all-NVLink ring of six exists."""
    data = json.loads(
        cli("--topology", "dgx1-v100", "plan", "-n", "6", "--sensitive", "--json").stdout
    )
    gpus = data["gpus"]
    from gpualloc.topologies import load_bundled

    topology = load_bundled("dgx1-v100")
    ring = list(zip(gpus, [*gpus[1:], gpus[0]], strict=True))
    assert all(topology.link(a, b).nvlinks for a, b in ring), gpus


def test_explain_says_why_there_is_no_runner_up(cli) -> None:
    """On a real one-GPU H200, plan -n 1 --explain printed an empty Runners-up table."""
    only = cli("--topology", "single-gpu", "plan", "-n", "1", "--explain")
    assert only.exit_code == 0, only.stderr
    assert "Runners-up" not in only.stdout
    assert "runners-up: none; these are the only usable GPUs" in only.stdout
    procedure = cli("--topology", "dgx1-v100", "plan", "-n", "2", "--explain", "--policy", "slurm")
    assert "runners-up: none; this policy follows a procedure" in procedure.stdout


def test_the_preserve_reason_counts_every_pair_it_keeps(cli) -> None:
    """'keeps the pairs NV2 1-2, NV2 1-5, NV2 2-3 free (450 GB/s)' named three pairs as if
    they made the 450 GB/s; twelve do."""
    why = next(
        line
        for line in cli("-t", "dgx1-v100", "plan", "-n", "1", "--explain").stdout.splitlines()
        if line.startswith("why: ")
    )
    assert why.startswith(
        "why: keeps 450 GB/s of NVLink among the GPUs left free, over 12 pairs "
        "(NV2 1-2, NV2 1-5, NV2 2-3 and 9 more)"
    ), why
    assert "it ties on the objective: chosen by lower GPU indices (than 1 GPU 1)" in why


def test_plan_reads_the_ledger_and_says_so(cli) -> None:
    """With GPU 3 held, plan printed 0,3 while run --dry-run said another pair: plan counted
    every GPU free and did not say so."""
    held = cli("-t", "dgx1-v100", "alloc", "-n", "1", "--gpus", "3", "--hold")
    assert held.exit_code == 0, held.stderr
    now = json.loads(cli("-t", "dgx1-v100", "plan", "-n", "2", "--json").stdout)
    dry = cli("-t", "dgx1-v100", "run", "-n", "2", "--dry-run", "--json", "--", "true")
    assert now["gpus"] == json.loads(dry.stdout)["placement"]["gpus"] != [0, 3]
    assert now["basis"]["kind"] == "now" and now["basis"]["taken"] == [3]
    assert "held by" in now["basis"]["held_by"][0]
    text = cli("-t", "dgx1-v100", "plan", "-n", "2").stdout
    assert "planned on the GPUs free now: GPU 3 taken" in text
    what_if = json.loads(
        cli("-t", "dgx1-v100", "plan", "-n", "2", "--assume-free", "--json").stdout
    )
    assert what_if["gpus"] == [0, 3] and what_if["basis"] == {
        "kind": "assume-free", "taken": [], "held_by": []
    }  # fmt: skip
    busy = cli("-t", "dgx1-v100", "plan", "-n", "2", "--busy", "0")
    assert "what if GPU 0 taken (--busy): the ledger and processes ignored" in busy.stdout
    full = cli("-t", "dgx1-v100", "plan", "-n", "8")
    assert full.exit_code == 10, full.stderr  # fits the host, not now: as run says
    assert "error: the job needs 8 GPUs and 7 are free now (GPU 3 taken)" in full.stderr
    both = cli("-t", "dgx1-v100", "plan", "-n", "2", "--assume-free", "--busy", "1")
    assert both.exit_code == 2 and "--assume-free and --busy" in both.stderr


def test_explain_beside_compare_is_refused(cli) -> None:
    """--explain was silently ignored beside --compare."""
    result = cli("-t", "dgx1-v100", "plan", "-n", "2", "--explain", "--compare")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: --explain explains one policy's choice")


def test_plan_of_a_mig_device_reads_the_ledger(cli) -> None:
    """plan --mig counted every MIG device free, as plan did every GPU."""
    first = json.loads(cli("-t", "dgx-a100-mig", "plan", "--mig", "3g.20gb", "--json").stdout)
    held = cli("-t", "dgx-a100-mig", "alloc", "--mig", "3g.20gb", "--hold")
    assert held.exit_code == 0, held.stderr
    now = json.loads(cli("-t", "dgx-a100-mig", "plan", "--mig", "3g.20gb", "--json").stdout)
    assert now["mig_device"]["device"] != first["mig_device"]["device"]
    assert now["basis"] == {"kind": "now", "taken": [first["mig_device"]["device"]]}
    what_if = cli("-t", "dgx-a100-mig", "plan", "--mig", "3g.20gb", "--assume-free")
    assert first["mig_device"]["uuid"] in what_if.stdout
    assert "(--assume-free): the ledger ignored" in what_if.stdout
