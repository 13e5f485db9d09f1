"""A timing profile is the device's: ``make bench-timing`` records the device in words (``core.device``), and the
places that price rounds with a profile flag one timed elsewhere (the eval, in one line; an exported folder, with
a warning)."""

from __future__ import annotations

import json

import pytest

from core.device import describe_device, same_device
from decoding.timing_provenance import other_backend, other_decoder, other_device


def test_the_cpu_is_described_by_its_model_and_threads():
    here = describe_device("cpu")
    assert here.startswith("cpu (") and here.endswith(" threads)") and same_device(here, here)


def test_a_backend_running_its_own_threads_names_them():
    """llama.cpp runs each model on the threads its pair file sets, whatever torch's count: a one-thread profile
    says one thread, so an eval at one thread takes it as its own."""
    assert describe_device("cpu", 1).endswith(", 1 threads)")
    assert describe_device("cpu", 1) != describe_device("cpu", 7)


@pytest.mark.parametrize("recorded, here, same", [
    ("cpu (Intel(R) Xeon(R) X, 2 threads)", "cpu (Intel(R) Xeon(R) X, 2 threads)", True),
    ("cpu (Intel(R) Xeon(R) X, 2 threads)", "cpu (Intel(R) Xeon(R) X, 4 threads)", False),
    ("cpu (AMD EPYC Y, 2 threads)", "cpu (Intel(R) Xeon(R) X, 2 threads)", False),
    ("NVIDIA H100 80GB HBM3", "cpu (Intel(R) Xeon(R) X, 2 threads)", False),
    ("cpu (cpu, 2 threads)", "cpu (Intel(R) Xeon(R) X, 2 threads)", True),  # written before the model was named
    ("cpu (x86_64, 2 threads)", "cpu (Intel(R) Xeon(R) X, 4 threads)", False),
    (None, "cpu (Intel(R) Xeon(R) X, 2 threads)", False),
])
def test_a_profile_describes_only_the_device_it_was_timed_on(recorded, here, same):
    assert same_device(recorded, here) is same


def test_the_eval_flags_a_goodput_timing_of_another_device(tmp_path, capsys):
    from test_eval_latency import timing_file
    from test_eval_run import make_cfg

    from evaluation.config import Sweep
    from evaluation.run import flag_other_devices

    gpu, here = tmp_path / "gpu.json", tmp_path / "here.json"
    gpu.write_text(json.dumps({**timing_file(), "device": "NVIDIA H100 80GB HBM3"}))
    here.write_text(json.dumps({**timing_file(), "device": describe_device("cpu")}))
    assert other_device(here, describe_device("cpu")) is None
    assert "NVIDIA H100" in other_device(gpu, describe_device("cpu"))
    for timing, flagged in ((gpu, True), (here, False)):
        cfg = make_cfg(tmp_path, device="cpu", timing=str(gpu),  # cfg.timing predicts another device on purpose
                       policies=[Sweep("target_only"), Sweep("goodput", fixed={"timing": str(timing)})])
        flag_other_devices(cfg)
        err = capsys.readouterr().err
        assert (f"note: {timing} was timed on NVIDIA H100" in err) is flagged and err.count("note:") == int(flagged)
    llama = tmp_path / "llama.json"
    llama.write_text(json.dumps({**timing_file(), "device": describe_device("cpu"), "backend": "llama_cpp"}))
    cfg = make_cfg(tmp_path, device="cpu",
                   policies=[Sweep("target_only"), Sweep("goodput", fixed={"timing": str(llama)})])
    flag_other_devices(cfg)  # a transformers eval priced by llama.cpp's kernels
    err = capsys.readouterr().err
    assert f"note: {llama} was timed on backend llama_cpp, not on this eval's transformers" in err
    assert other_backend(here, "transformers") is None and "on backend transformers" in other_backend(here, "llama_cpp")
    graphs = tmp_path / "graphs.json"
    graphs.write_text(json.dumps({**timing_file(), "device": describe_device("cpu"), "decoder": "graphs"}))
    cfg = make_cfg(tmp_path, device="cpu",
                   policies=[Sweep("target_only"), Sweep("goodput", fixed={"timing": str(graphs)})])
    flag_other_devices(cfg)  # an eager eval priced by a graph decoder's forwards
    err = capsys.readouterr().err
    assert f"note: {graphs} timed the graphs decoder's forwards, this eval runs the eager one" in err
    assert other_decoder(here, "eager") is None and other_decoder(graphs, "eager") is not None
    from evaluation.hf_peer import HFPeer

    cfg = make_cfg(tmp_path, device="cpu", decoder="static", policies=[Sweep("target_only")],
                   hf_peer=HFPeer(enabled=True, timing=str(here)))
    flag_other_devices(cfg)  # generate() runs eager forwards whatever decoder ours runs: its eager timing is its own
    assert "decoder's forwards" not in capsys.readouterr().err


def test_a_device_that_is_not_here_is_one_line(capsys):
    import torch

    from core.errors import SettingError
    from core.models import resolve_device
    from evaluation import bench_timing

    with pytest.raises(SettingError, match="unknown device 'gpu0'"):
        resolve_device("gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(SettingError, match="no CUDA GPU that torch can use"):
            bench_timing.main(["--device", "cuda"])
