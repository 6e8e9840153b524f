"""The generated documentation pages are in step with what they are generated from: the TIDE_*
registry (`tide env`), the CLI (`tide --help`), the C ABI (include/tide/tide.h) and the benchmark
JSON in docs/results/ (docs/results.md and README.md's results table). Each is regenerated into a
temporary folder and compared with the committed one. The Sphinx build itself is `make docs`."""

import json
import pathlib
import re

import pytest
from conftest import load_script


@pytest.fixture(scope="module")
def gen_docs():
    return load_script(pathlib.Path(__file__).resolve().parents[2] / "scripts" / "gen_docs.py")


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


def test_no_measurement_typed_into_the_benchmarks_page(repo):
    """docs/benchmarks.md says what each benchmark does and is held to; what it measured is on
    the generated results page. Above its History section: no dated measurement."""
    page = (repo / "docs" / "benchmarks.md").read_text().split("\n## History", 1)[0]
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", page)


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


def test_gpu_update_phase_copy_bounds_from_a_report(gen_docs, tmp_path):
    """bench/gpu_update_phase.py's copy bandwidth and summary in a gpu-check report (synthetic:
    made-up numbers, for rendering only): the page's table has the bound with both directions at
    once, the term that bound it, the each-alone bound and tide's ratio to each; the headline
    table (results page and README) shows them too."""
    lines = [{"bench": "gpu_update_phase", "case": "copy_bandwidth", "h2d_gbps": 11.0,
              "d2h_gbps": 11.0, "both_h2d_gbps": 7.0, "both_d2h_gbps": 8.0, "both_gbps": 14.0},
             {"bench": "gpu_update_phase", "case": "summary", "bytes_each_way_per_param": 14,
              "copy_bound_seconds": 0.2, "copy_bound_by": "both_directions",
              "tide_gpu_over_copy_bound": 1.05, "tide_gpu_over_copy_bound_target": "<= 1.10",
              "tide_gpu_over_copy_bound_met": True, "copy_bound_each_alone_seconds": 0.1273,
              "tide_gpu_over_copy_bound_each_alone": 1.65, "tide_cpu_over_tide_auto": 1.25}]
    report = {"machine": {"gpus": ["SYNTHETIC-GPU (test fixture, not a measurement)"],
                          "cpu": "SYNTHETIC-CPU", "cores": 16, "commit": "0000000syn",
                          "date": "2000-01-01T00:00:00+00:00"},
              "bundle": {"commit": "0000000synthetic"}, "mode": "synthetic test fixture",
              "steps": [{"step": "bench-gpu_update_phase", "status": "passed",
                         "figures": {"lines": lines}}]}
    (tmp_path / "gpu-check-synthetic.json").write_text(json.dumps(report))
    page = gen_docs.gen_results(tmp_path)
    summary = page.split("## Summary", 1)[1].split("\n## ", 1)[0]
    assert "| real GPU: update phase, tide all-GPU / copy bound (≤ 1.10) | 1.05 × |" in summary
    assert ("directions at once) | 0.2 s (bound by both\\_directions) |") in summary
    assert ("| real GPU: update phase, tide all-GPU / copy bound with each direction measured "
            "alone | 1.65 × (that bound 0.1273 s) |") in summary
    assert "| real GPU: update phase, tide all-CPU / tide auto | 1.25 × |" in summary
    section = page.split("## gpu\\_update\\_phase", 1)[1]
    for key in ("both_h2d_gbps", "both_d2h_gbps", "copy_bound_seconds", "copy_bound_by",
                "copy_bound_each_alone_seconds", "tide_gpu_over_copy_bound",
                "tide_gpu_over_copy_bound_each_alone"):
        assert f"| {gen_docs.escape(key)} |" in section, key
    readme = "# x\n\n" + gen_docs.README_BEGIN + "\n" + gen_docs.README_END + "\n" + \
        gen_docs.TIMELINE_BEGIN + "\n" + gen_docs.TIMELINE_END + "\n"
    readme = gen_docs.readme_with_results(readme, tmp_path)
    assert "tide all-GPU / copy bound (≤ 1.10) | 1.05 × |" in readme
    assert "(that bound 0.1273 s)" in readme and "commit `0000000syn`" in readme
    # Without the bound's term, the bound is shown alone.
    lines[1].pop("copy_bound_by")
    (tmp_path / "gpu-check-synthetic.json").write_text(json.dumps(report))
    assert "directions at once) | 0.2 s |" in gen_docs.gen_results(tmp_path)


def test_gpu_iteration_bandwidth_with_both_directions_at_once(gen_docs, tmp_path):
    """gpu_iteration's bandwidth line with the concurrent rates (the synthetic fixture, with
    made-up both-ways figures added) shows them beside the each-alone ones."""
    report = json.loads(FIXTURE.read_text())
    for step in report["steps"]:
        for line in step.get("figures", {}).get("lines", []):
            if line.get("case") == "bandwidth":
                line.update({"both_h2d_gbps": 30.0, "both_d2h_gbps": 25.0, "both_gbps": 50.0})
    (tmp_path / "gpu-check-synthetic.json").write_text(json.dumps(report))
    section = gen_docs.gen_results(tmp_path).split("## Whole iterations on a real GPU", 1)[1]
    assert ("50 GB/s to the GPU, 40 GB/s back each alone, 30 and 25 GB/s with both at once"
            in section)


def test_gpu_iteration_host_memory_in_place_beside_the_copy(gen_docs, tmp_path):
    """tide_membw's in-place and Adam-pattern figures, when the bandwidth line has them, beside
    the copy's (which counts no write-allocate traffic); without them, the copy's alone."""
    report = json.loads(FIXTURE.read_text())
    (tmp_path / "gpu-check-synthetic.json").write_text(json.dumps(report))
    section = gen_docs.gen_results(tmp_path).split("## Whole iterations on a real GPU", 1)[1]
    assert "(copy, read + written)" in section and "tide\\_membw" not in section
    for step in report["steps"]:
        for line in step.get("figures", {}).get("lines", []):
            if line.get("case") == "bandwidth":
                line.update({"host_memory_update_gbps": 95.5, "host_memory_adam_gbps": 88.0})
    (tmp_path / "gpu-check-synthetic.json").write_text(json.dumps(report))
    section = gen_docs.gen_results(tmp_path).split("## Whole iterations on a real GPU", 1)[1]
    assert ("(copy, read + written); 95.5 GB/s updated in place, 88 GB/s in Adam's pattern "
            "(tide\\_membw)" in section)


def test_gpu_iteration_device_memory_bandwidth_and_bounds(gen_docs, tmp_path):
    """The device memory's bandwidth beside the others, and the update phases over the time
    their bytes take at it (the synthetic fixture, with made-up figures added); a bound that is
    None (tide auto did not keep everything resident) is left out, never shown as a number."""
    report = json.loads(FIXTURE.read_text())
    for step in report["steps"]:
        for line in step.get("figures", {}).get("lines", []):
            if line.get("case") == "summary":
                line.update({"device_memory_gbps": 4000.0,
                             "torch_gpu_update_over_device_memory_bound": 1.5,
                             "tide_auto_update_over_device_memory_bound": None})
    (tmp_path / "gpu-check-synthetic.json").write_text(json.dumps(report))
    section = gen_docs.gen_results(tmp_path).split("## Whole iterations on a real GPU", 1)[1]
    assert "device memory bandwidth 4000 GB/s (copy, read + written)" in section
    assert ("| floor's update phase / its bytes at the device memory's bandwidth | 1.5 |  | – |"
            in section)
    assert "tide auto's all-resident update phase" not in section


def test_the_gpu_iteration_plot(gen_docs, repo, tmp_path):
    """scripts/gen_docs.py results draws the whole-iteration bars from the committed reports (the
    README shows the picture under their table); nothing without a gpu_iteration run."""
    pytest.importorskip("matplotlib")
    runs = gen_docs.load_results(repo / "docs" / "results")
    out = tmp_path / "plot.png"
    has_run = any(r["name"] == gen_docs.GPU_ITERATION for r in runs)
    assert gen_docs.gpu_iteration_plot(runs, out) == has_run
    if has_run:
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (repo / "docs" / gen_docs.GPU_ITERATION_PLOT).is_file(), "committed beside results.md"
        assert f"](docs/{gen_docs.GPU_ITERATION_PLOT})" in (repo / "README.md").read_text()
    assert not gen_docs.gpu_iteration_plot([r for r in runs if r["name"] != gen_docs.GPU_ITERATION],
                                           tmp_path / "none.png")
    assert not (tmp_path / "none.png").exists()


def test_stand_in_iterations_from_a_capture(gen_docs, tmp_path):
    """bench_iteration's lines (made-up numbers, for rendering only) become one section per
    variant: tide's ratios against their targets (under varying memory, strictly below the best
    static configuration) and every configuration's seconds; README's table has the headlines.
    The lines' nested by_memory_state stays in the JSON, not in a generic table."""
    capture = {"machine": "SYNTHETIC-VM", "date": "2000-01-01T00:00:00+00:00",
               "commit": "0000000syn", "dirty": False, "command": "build/bin/bench_iteration",
               "seconds": 400.0}
    common = {"bench": "iteration", "by_memory_state": [{"headroom_bytes": 1}], "capture": capture}
    lines = [
        dict(common, variant="partial", config="dos_k3", headroom="measured once",
             iteration_s=0.8, forward_s=0.1, backward_s=0.3, update_s=0.4),
        dict(common, variant="partial", config="tide", headroom="forecast every iteration",
             iteration_s=0.6, forward_s=0.1, backward_s=0.3, update_s=0.2, over_best_static=0.75,
             best_static="dos_k3", over_best_static_target=1.03, over_tide_no_residency=0.9,
             resident_subgroups=20, pressured_iterations=0, iterations_timed=5,
             evicted_subgroups=0),
        dict(common, variant="varying", config="tide", headroom="forecast every iteration",
             iteration_s=1.0, over_best_static=1.0, best_static="dos_k2",
             over_best_static_target=1.0, resident_subgroups=0),
        dict(common, variant="fits", config="tide", headroom="forecast every iteration",
             iteration_s=0.5, over_best_static=0.5, best_static="dos_k2",
             over_best_static_target=1.03, over_no_offload=1.2, over_no_offload_target=1.15,
             speedup_over_zero_offload=3.5, speedup_over_zero_offload_published=4.0,
             speedup_target=3.0, resident_subgroups=50),
        {"bench": "iteration", "variant": "fits", "summary": True, "capture": capture},
    ]
    (tmp_path / "iteration.jsonl").write_text("".join(json.dumps(l) + "\n" for l in lines))
    page = gen_docs.gen_results(tmp_path)
    section = page.split("## Whole iterations on the stand-in", 1)[1].split("\n## ", 1)[0]
    assert "SYNTHETIC-VM; 2000-01-01T00:00:00+00:00; commit `0000000syn`" in section
    partial = section.split("### partial", 1)[1].split("###", 1)[0]
    assert "| tide / best static configuration (dos\\_k3) | 0.75 | ≤ 1.03 | yes |" in partial
    assert "| tide / tide without resident subgroups | 0.9 |  | – |" in partial
    assert "| dos\\_k3 | measured once | 0.8 | 0.1 | 0.3 | 0.4 | 1.333 | – |" in partial
    assert "| tide | forecast every iteration | 0.6 | 0.1 | 0.3 | 0.2 | 1 | 20 |" in partial
    assert "in 0 of 5 timed iterations" in partial
    varying = section.split("### varying", 1)[1].split("###", 1)[0]
    assert "| tide / best static configuration (dos\\_k2) | 1 | < 1 | no |" in varying
    fits = section.split("### fits", 1)[1]
    assert "| tide / no-offload floor | 1.2 | ≤ 1.15 | no |" in fits
    assert "| ZeRO-Offload-style / tide | 3.5 | ≥ 3 | yes |" in fits
    # the benchmark's order, not the file's
    assert section.index("### varying") < section.index("### fits") < section.index("### partial")
    assert "headroom\\_bytes" not in page and "## iteration" not in page
    readme = "# x\n\n" + gen_docs.README_BEGIN + "\n" + gen_docs.README_END + "\n" + \
        gen_docs.TIMELINE_BEGIN + "\n" + gen_docs.TIMELINE_END + "\n"
    readme = gen_docs.readme_with_results(readme, tmp_path)
    assert ("part of the state fits: tide / best static (≤ 1.03) | 0.75 (best: dos\\_k3; 20 "
            "subgroups resident) | SYNTHETIC-VM") in readme
    assert "the state fits: tide / no-offload floor (≤ 1.15) | 1.2 (50 subgroups resident)" in readme


def test_pages_and_results_are_replaced_whole_or_not_at_all(gen_docs, tmp_path, monkeypatch):
    """gen_docs writes beside the file and renames over it: a failure on the way (here the
    rename) leaves the old content and no stray file."""
    page = tmp_path / "results.md"
    page.write_text("old\n")
    page.chmod(0o644)
    gen_docs.replace_file(page, "new\n")
    assert page.read_text() == "new\n" and list(tmp_path.iterdir()) == [page]
    assert page.stat().st_mode & 0o777 == 0o644  # the mode it had, not mkstemp's 0600
    source = tmp_path / "picture.bin"
    source.write_bytes(b"\x89PNG")
    gen_docs.replace_file(page, source)
    assert page.read_bytes() == b"\x89PNG"

    def refuse(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(gen_docs.os, "replace", refuse)
    with pytest.raises(OSError, match="disk full"):
        gen_docs.replace_file(page, "lost\n")
    assert page.read_bytes() == b"\x89PNG"
    assert set(tmp_path.iterdir()) == {page, source}
