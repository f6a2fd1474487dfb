"""``gpualloc plan`` and ``topo import --bandwidth-matrix`` through the real entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpualloc.placement.registry import policy_names

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
        (["-n", "0"], 2, "must be at least 1"),  # issue 30, point 6: not pydantic's wording
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
    from tests.conftest import recorded

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
        (("-n", "8"), "mapa"),  # a ring through all eight GPUs: 8 edges, Table 2's domain
        (("-n", "5", "--pattern", "all"), "bottleneck"),  # 10 edges: beyond it
        (("-n", "8", "--pattern", "all"), "bottleneck"),  # 28 edges: Table 2 says -3434 GB/s
    ],
)
def test_auto_uses_table_2_only_within_its_domain(cli, args: tuple[str, ...], model: str) -> None:
    data = json.loads(cli("--topology", "dgx1-v100", "plan", *args, "--json").stdout)
    assert data["effective_model"] == model and data["scores"]["effective_gbps"] > 0
    forced = cli("--topology", "dgx1-v100", "plan", *args, "--score", "mapa", "--json")
    assert json.loads(forced.stdout)["effective_model"] == "mapa"  # asked for: given


def test_explain_says_why_there_is_no_runner_up(cli) -> None:
    """On a real one-GPU H200, plan -n 1 --explain printed an empty Runners-up table."""
    only = cli("--topology", "single-gpu", "plan", "-n", "1", "--explain")
    assert only.exit_code == 0, only.stderr
    assert "Runners-up" not in only.stdout
    assert "runners-up: none; these are the only usable GPUs" in only.stdout
    procedure = cli("--topology", "dgx1-v100", "plan", "-n", "2", "--explain", "--policy", "slurm")
    assert "runners-up: none; this policy follows a procedure" in procedure.stdout
