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
