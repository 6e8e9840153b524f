"""The generated documentation pages are in step with what they are generated from: the TIDE_*
registry (`tide env`), the CLI (`tide --help`), the C ABI (include/tide/tide.h) and the benchmark
JSON in docs/results/ (docs/results.md and README.md's results table). Each is regenerated into a
temporary folder and compared with the committed one. The Sphinx build itself is `make docs`."""

import importlib.util
import json
import pathlib
import re

import pytest


@pytest.fixture(scope="module")
def gen_docs():
    script = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "gen_docs.py"
    spec = importlib.util.spec_from_file_location("gen_docs", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check(committed, fresh: str, command: str) -> None:
    assert committed.exists(), f"{committed} is missing: run {command}"
    assert committed.read_text() == fresh, f"{committed} is out of date: run {command}"


def test_knobs_page(gen_docs, repo, build_dir, tmp_path):
    fresh = gen_docs.gen_knobs(build_dir / "bin" / "tide")
    (tmp_path / "knobs.md").write_text(fresh)
    check(repo / "docs" / "reference" / "knobs.md", (tmp_path / "knobs.md").read_text(),
          "scripts/gen_docs.py knobs")


def test_cli_page(gen_docs, repo, build_dir, tmp_path):
    (tmp_path / "cli.md").write_text(gen_docs.gen_cli(build_dir / "bin" / "tide"))
    check(repo / "docs" / "reference" / "cli.md", (tmp_path / "cli.md").read_text(),
          "scripts/gen_docs.py cli")


def test_c_abi_page(gen_docs, repo, tmp_path):
    (tmp_path / "c-abi.md").write_text(gen_docs.gen_abi(repo / "include" / "tide" / "tide.h"))
    check(repo / "docs" / "reference" / "c-abi.md", (tmp_path / "c-abi.md").read_text(),
          "scripts/gen_docs.py abi")


def test_results_page_and_readme_table(gen_docs, repo, tmp_path):
    results = repo / "docs" / "results"
    (tmp_path / "results.md").write_text(gen_docs.gen_results(results))
    check(repo / "docs" / "results.md", (tmp_path / "results.md").read_text(),
          "scripts/gen_docs.py results")
    readme = (repo / "README.md").read_text()
    (tmp_path / "README.md").write_text(gen_docs.readme_with_results(readme, results))
    check(repo / "README.md", (tmp_path / "README.md").read_text(), "scripts/gen_docs.py results")


def test_every_result_carries_machine_date_and_commit(gen_docs, repo):
    runs = gen_docs.load_results(repo / "docs" / "results")
    assert runs, "docs/results/ holds no benchmark JSON"
    for run in runs:
        assert run["capture"]["machine"] and run["capture"]["date"] and run["capture"]["commit"]


def test_every_abi_function_is_on_the_page(repo):
    """The header parser reads every TIDE_API function, whatever it is named."""
    header = (repo / "include" / "tide" / "tide.h").read_text()
    page = (repo / "docs" / "reference" / "c-abi.md").read_text()
    functions = re.findall(r"^TIDE_API[^;(]*?\b(\w+)\s*\(", header, re.M)
    assert len(functions) > 10
    missing = [f for f in functions if f"`{f}`" not in page]
    assert not missing, f"C ABI functions missing from docs/reference/c-abi.md: {missing}"


def test_gpu_check_reports_are_read(gen_docs, tmp_path):
    """A `make gpu-check` report (scripts/gpu_check.py's report.json) copied into docs/results/
    shows its benchmark lines with the report's machine, date and commit."""
    report = {"machine": {"gpus": ["NVIDIA H200, 143771 MiB, 570.00, 9.0"], "cpu": "some CPU",
                          "cores": 16, "commit": "abc1234", "date": "2026-01-01T00:00:00+00:00"},
              "bundle": {"commit": "abc1234def"}, "mode": "real GPU, from out/gpu-bundle.tar.gz",
              "steps": [{"step": "bench-gpu_update_phase", "status": "passed", "figures": {
                  "lines": [{"bench": "gpu_update_phase", "case": "summary", "auto_over_cpu": 1.5}]}},
                        {"step": "example", "status": "passed", "figures": {"steps": 100}}]}
    (tmp_path / "gpu-check-h200.json").write_text(json.dumps(report))
    page = gen_docs.gen_results(tmp_path)
    assert "NVIDIA H200" in page and "abc1234def" in page and "auto\\_over\\_cpu" in page
    assert "No real-GPU report" not in page


def test_no_measured_number_typed_into_the_readme(repo):
    """README.md's figures are the generated table's: outside its markers, no dated
    measurement of the kind the old README carried (a date, or seconds/ns/GB/s figures)."""
    readme = (repo / "README.md").read_text()
    outside = re.sub(r"<!-- (results|timeline):begin.*?<!-- \1:end -->", "", readme, flags=re.S)
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", outside)
    assert not re.search(r"\d+(\.\d+)? ?(ns|µs|ms|GB/s|params/s)\b", outside)


def test_readme_is_short(repo):
    assert len((repo / "README.md").read_text().splitlines()) <= 250


FIXTURE = pathlib.Path(__file__).resolve().parent / "fixtures" / "gpu_check_report_synthetic.json"


def test_gpu_iteration_table_from_a_report(gen_docs, tmp_path):
    """bench/gpu_iteration.py's lines in a gpu-check report (a synthetic fixture: made-up numbers,
    for rendering only) become a table on the results page and a short one in README's results
    section, with the machine, date, commit and the bandwidths beside them."""
    (tmp_path / "gpu-check-synthetic.json").write_text(FIXTURE.read_text())
    page = gen_docs.gen_results(tmp_path)
    section = page.split("## Whole iterations on a real GPU", 1)[1].split("\n## ", 1)[0]
    assert gen_docs.GPU_ITERATION_NONE not in page
    assert "SYNTHETIC-GPU (test fixture, not a measurement); SYNTHETIC-CPU, 16 cores" in section
    assert "2000-01-01T00:00:00+00:00; commit `0000000syn`" in section
    assert "host memory bandwidth 100 GB/s" in section and "50 GB/s to the GPU, 40 GB/s back" in section
    assert "| tide\\_auto | auto | none | 125 | 30 | 1.25 | 9 | gpu\\_subgroups 3, cpu\\_subgroups 1 |" \
        in section
    assert "| capped\\_tide\\_auto | auto | 0.0625 | 200 |" in section
    assert "| capped\\_tide\\_gpu | gpu | capped | – | – | – | – | out of memory |" in section
    assert "not run: this build of tide has no TIDE\\_RESIDENCY knob" in section
    assert "| plain-torch offload / tide auto (speedup) | 4 | ≥ 2.5 | yes |" in section
    assert "| capped: tide auto / best fixed placement | 0.8 | ≤ 1.03 | yes |" in section
    assert "0.001667 (tolerance 0.02): they agree" in section
    # Shown once, in its own section, not again as a generic table.
    assert page.count("## gpu\\_iteration") == 0 and page.count("| tide\\_auto |") == 1
    readme = "# x\n\n" + gen_docs.README_BEGIN + "\n" + gen_docs.README_END + "\n" + \
        gen_docs.TIMELINE_BEGIN + "\n" + gen_docs.TIMELINE_END + "\n"
    readme = gen_docs.readme_with_results(readme, tmp_path)
    assert "| tide\\_auto | 125 | 1.25 |" in readme and "| torch\\_offload | 500 | 5 |" in readme
    assert "host memory bandwidth 100 GB/s" in readme and "commit `0000000syn`" in readme
    assert "capped\\_tide\\_gpu" not in readme  # the README's table: the cases that ran


def test_without_a_gpu_iteration_run_the_readme_says_so(gen_docs, repo, tmp_path):
    """No numbers are invented: with no report, the page and README say no run is recorded."""
    page = gen_docs.gen_results(tmp_path)
    assert gen_docs.GPU_ITERATION_NONE in page
    recorded = any(r["name"] == "gpu_iteration"
                   for r in gen_docs.load_results(repo / "docs" / "results"))
    readme = (repo / "README.md").read_text()
    assert (gen_docs.GPU_ITERATION_NONE in readme) is not recorded
