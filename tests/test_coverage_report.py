"""``python -m tapegrad coverage``: the generated docs/coverage.md is up to date (modulo its
date line), and the report's grouping does what its reasons say."""
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from tapegrad import cli, coverage  # noqa: E402


@pytest.fixture(scope="module")
def report():
    return coverage.generate(date="2000-01-01")


def test_docs_coverage_is_up_to_date():
    # in a fresh interpreter: what earlier tests imported or patched (lazy torch submodules,
    # attributes set at run time) must not change the report being checked
    code = ("from tapegrad import coverage; import sys; "
            "sys.stdout.write(coverage.generate(date='2000-01-01'))")
    fresh = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True).stdout
    path = coverage.default_path()
    assert path.exists(), f"{path} is missing: run `python -m tapegrad coverage --write`"
    old = path.read_text()
    assert any(line.startswith(coverage.DATE_PREFIX) for line in old.splitlines())
    assert coverage.strip_date(old) == coverage.strip_date(fresh), (
        f"{path} is out of date: names were added to or removed from tapegrad (or PyTorch "
        "changed). Regenerate it with `python -m tapegrad coverage --write` and commit it.")


def test_report_sections_and_reasons(report):
    assert report.startswith("# API coverage against PyTorch\n")
    assert f"{coverage.DATE_PREFIX}2000-01-01 by `python -m tapegrad coverage --write`" in report
    assert "do not edit it" in report and "--write` whenever names are added" in report
    for title, torch_path, _, _ in coverage.NAMESPACES:
        assert f"\n## {title}\n" in report
        assert f"| [`{torch_path}`]" in report
    for group, reason, _ in coverage.EXCLUSIONS:
        assert f"| {group} | {reason} |" in report


def test_counts_add_up():
    import torch

    r = coverage.namespace_report("Tensor", "torch.Tensor", "tapegrad.Tensor")
    every = set(dir(torch.Tensor)) - set(dir(object))
    excluded = {n for names in r["excluded"].values() for n in names}
    assert set(r["present"]) | set(r["missing"]) | excluded == every
    assert not set(r["present"]) & set(r["missing"])
    assert not (set(r["present"]) | set(r["missing"])) & excluded


def test_grouping():
    t = coverage.namespace_report("torch", "torch", "tapegrad")
    x = t["excluded"]
    # present names count as present; a few that PyTorch scripts use everywhere
    for n in ("zeros", "matmul", "float32", "no_grad", "Tensor", "cat"):
        assert n in t["present"], n
    assert "cuda" in t["present"]  # tapegrad.cuda exists: counted though a submodule
    assert "jit" in x["submodules"] and "cudnn_convolution" in x["accelerator devices"]
    assert "quantize_per_tensor" in x["quantization"] and "qint8" in x["quantization"]
    assert "sparse_hsmm" in x["sparse layouts"] or "hsmm" in x["sparse layouts"]
    assert "view_as_real" in x["complex numbers"] + t["present"]
    assert "float8_e4m3fn" in x["dtypes numpy lacks"] and "ScriptModule" in x[
        "TorchScript, fx, export"]
    assert "eig" in x["removed or deprecated"] and "_C" in x["private"]
    # look-alikes of excluded names still count: quantile is no quantization, orthogonal_
    # no device, nn.init.sparse_ (a dense initialiser) no sparse layout
    assert "quantile" in t["missing"] + t["present"]
    init = coverage.namespace_report("nn.init", "torch.nn.init", "tapegrad.nn.init")
    assert "sparse_" in init["missing"] + init["present"]
    assert "orthogonal_" in init["present"]
    tensor = coverage.namespace_report("Tensor", "torch.Tensor", "tapegrad.Tensor")
    assert "__add__" in tensor["present"] and "__dict__" in tensor["excluded"]["private"]
    assert "is_cuda" in tensor["present"] + tensor["excluded"]["accelerator devices"]


def test_missing_namespace_is_reported():
    r = coverage.namespace_report("nope", "torch.fft", "tapegrad.no_such_namespace")
    assert not r["available"] and not r["present"] and "fft" in r["missing"]


def test_cli(tmp_path, capsys):
    out = tmp_path / "coverage.md"
    assert cli.main(["coverage", "-o", str(out)]) == 0
    assert out.read_text().startswith("# API coverage against PyTorch")
    assert cli.main(["coverage", "--check", "-o", str(out)]) == 0
    out.write_text(out.read_text().replace("| **all** |", "| **every** |"))
    assert cli.main(["coverage", "--check", "-o", str(out)]) == 1
    assert "out of date" in capsys.readouterr().err


def test_without_torch(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    assert cli.main(["coverage"]) == 2
    err = capsys.readouterr().err
    assert "PyTorch is not installed" in err and "pip install torch" in err
