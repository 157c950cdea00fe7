"""The NVML sidecar on CPU: a fake NVML module at the hardware boundary, the real reader after it."""

from __future__ import annotations

import logging

import pytest

import diag
from diag import agent, schema
from diag.nvml import sidecar as nvml
from diag.nvml.seam import NA, Nvml, load_module
from tests.unit import fake_nvml


def _sidecar(tmp_path, **kw):
    car = nvml.Sidecar(str(tmp_path), interval=3600, module=fake_nvml.make(**kw), host="hostA")
    assert car.start(), car.error
    return car


def test_samples_every_field_and_loads_with_the_ranks(tmp_path):
    ag = agent.start(str(tmp_path), what=("steps",))
    ag.emit((schema.STEP, 1, ag.now(), 1000, 8, None, True))
    agent.stop()
    car = _sidecar(tmp_path, xids=[(1, 79)])
    car.sample_once()
    car.stop()  # the thread also took one sample at start
    tr = diag.load(str(tmp_path))
    assert tr.ranks == [next(iter(tr.headers))]  # the sidecar is not a rank
    gpu = tr.gpu
    assert len(gpu) >= 4 and set(gpu["index"]) == {0, 1} and set(gpu["host"]) == {"hostA"}
    g0 = gpu[gpu["index"] == 0].iloc[-1]
    assert g0["util"] == 50 and g0["mem_used"] == 2**30 and g0["mem_total"] == 80 * 2**30
    assert g0["power_w"] == pytest.approx(300.5) and g0["power_limit_w"] == 700
    assert (g0["sm_clock"], g0["mem_clock"], g0["temp_c"]) == (1980, 2619, 60)
    assert list(g0["throttle"]) == ["SwPowerCap", "HwSlowdown"]
    assert (g0["pcie_tx"], g0["pcie_rx"]) == (100 * 1024, 101 * 1024)
    assert g0["nvlink_tx"] > 0 and g0["nvlink_rx"] == pytest.approx(2 * g0["nvlink_tx"])
    assert g0["ecc_errors"] == 0
    g1 = gpu[gpu["index"] == 1]
    assert g1["ecc_errors"].isna().all()  # NotSupported on device 1 -> null, not an exception
    assert [x for xs in g1["xid"] for x in xs] == [79]


def test_first_nvlink_sample_has_no_rate(tmp_path):
    nv = Nvml(fake_nvml.make())
    nv.start()
    from diag.nvml.sample import GpuReader

    r = GpuReader(nv, 0)
    first, second = r.sample(), r.sample()
    assert first["nvlink_tx"] is None and second["nvlink_tx"] is not None


def test_missing_function_logged_once_and_null(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="diag.nvml")
    car = _sidecar(tmp_path, missing=("nvmlDeviceGetTemperature", "nvmlDeviceGetCurrentClocksEventReasons"))
    for _ in range(3):
        recs = car.sample_once()
    car.stop()
    assert all(r["temp_c"] is None for r in recs)
    assert recs[0]["throttle"] is None  # neither the new nor the old name exists
    logged = [r.message for r in caplog.records if "nvmlDeviceGetTemperature" in r.message]
    assert len(logged) == 1


def test_library_not_found_is_a_value_not_an_exception(tmp_path):
    car = nvml.Sidecar(str(tmp_path), module=fake_nvml.make(lib_missing=True))
    assert car.start() is False and car.error == "NVML not found"
    car.stop()
    assert not list(tmp_path.iterdir())  # nothing written without a GPU


def test_real_nvml_on_this_machine(tmp_path):
    mod = load_module()
    if mod is None:
        pytest.skip(reason="nvidia-ml-py not installed")
    car = nvml.Sidecar(str(tmp_path))
    started = car.start()
    car.stop()
    if started:
        pytest.skip(reason="this machine has an NVIDIA GPU: covered by diag.nvml.sidecar.selfcheck()")
    assert car.error == "NVML not found"


def test_selfcheck_prints_every_field(capsys, tmp_path):
    assert nvml.selfcheck(str(tmp_path), module=fake_nvml.make(count=1)) == 0
    out = capsys.readouterr().out
    for field in schema.FIELDS[schema.GPU]:
        assert f" {field} = " in out
    assert "Fake H000" in out
    assert nvml.selfcheck(str(tmp_path), module=fake_nvml.make(lib_missing=True)) == 1
    assert "no NVIDIA GPU (NVML not found)" in capsys.readouterr().out


def test_na_is_falsy_and_unique():
    assert not NA and repr(NA) == "N/A" and type(NA)() is NA
