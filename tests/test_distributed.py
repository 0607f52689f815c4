"""[distributed] N processes train one policy: 2 CPU processes (torchrun, gloo) take the same
optimizer step as 1 process over the same groups; train.py runs under torchrun and resumes with
any number of processes."""
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import train
from stub_env import StubEnv

ROOT = Path(__file__).resolve().parent.parent
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]  # what the `torchrun` command runs


def _torchrun(argv, cwd=ROOT):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([*TORCHRUN, "--standalone", "--nproc_per_node", "2", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_two_processes_take_the_one_process_step(tmp_path):
    """Each of 2 processes plays 2 of the 4 groups and updates on its own rows; the LoRA weights
    after the step equal (to float tolerance) those of one process updating on all 4 groups'
    trajectories, with the same minibatch (token-mean over the global token count)."""
    out = _torchrun([str(ROOT / "tests" / "ddp_worker.py"), str(tmp_path)])
    assert out.returncode == 0, out.stderr[-3000:]
    saved = pickle.loads((tmp_path / "ddp.pkl").read_bytes())
    assert saved["world"] == 2 and saved["groups"] == [0, 2]  # the main process held groups 0 and 2
    trajs = saved["trajs"]
    assert sorted({t.group for t in trajs}) == [0, 1, 2, 3] and len(trajs) == 16
    spread = {t.group for t in trajs if len({u.reward for u in trajs if u.group == t.group}) > 1}
    assert spread & {0, 2} and spread & {1, 3}  # both processes hold a group that trains (else the test is vacuous)
    args = train.parse_args(["--model=tiny", "--preset=none", "--groups=4", "--group-size=4", "--max-steps=1",
                             "--max-new-tokens=8", "--minibatches=1", "--micro-batch-rows=5", "--lr=1e-2",
                             "--lora-r=4", "--lora-alpha=8", "--hindsight=expert", "--kl-coef=0.01", "--eval-every=0", "--dtype=fp32",
                             "--seed=11", f"--output-dir={tmp_path}/one"])
    one = train.Trainer(args, env=StubEnv(1))
    lora = {n: p for n, p in one.model.named_parameters() if "lora_" in n}
    assert all(torch.equal(lora[n], saved["before"][n]) for n in lora)  # the same start
    rows = one.segments(trajs)
    adv = one.advantage(trajs, rows)
    logp = one.logprobs(rows, adv)
    stats = one.update(rows, adv, logp, one.credit(rows, adv, logp))
    assert stats["update/optimizer_steps"] == 1 == saved["stats"]["update/optimizer_steps"]
    moved = [n for n in lora if not torch.equal(saved["before"][n], saved["after"][n])]
    assert moved
    compared = stepped = 0
    for n in lora:  # where a gradient is near Adam's eps (1e-8), its float rounding moves the step itself:
        grad = one.optimizer.state[lora[n]]["exp_avg"].abs()  # 0.1 x |gradient|
        sure = grad > 1e-7  # gradient > 1e-6: a step of lr * sign(gradient), whatever the rounding
        assert torch.allclose(lora[n].detach()[sure], saved["after"][n][sure], atol=1e-6, rtol=1e-5), n
        compared, stepped = compared + int(sure.sum()), stepped + int((grad > 0).sum())
    assert compared > 0.9 * stepped  # nearly every weight that moved is compared: not a vacuous test
    # Adam's first step moves each weight by about lr * sign(gradient), which would hide a wrong
    # gradient scale: compare the gradients themselves (Adam's first moment is 0.1 * gradient)
    for p, m in zip(one.params, saved["exp_avg"]):
        assert torch.allclose(one.optimizer.state[p]["exp_avg"], m, atol=1e-8, rtol=1e-4)
    assert stats["update/grad_norm"] == pytest.approx(saved["stats"]["update/grad_norm"], rel=1e-5)
    assert stats["update/loss"] == pytest.approx(saved["stats"]["update/loss"], abs=1e-6)


@pytest.mark.slow
def test_train_py_under_torchrun_then_resumed_in_one_process(tmp_path):
    """`torchrun --nproc_per_node 2 train.py ...` runs 2 iterations with 2 processes (the log says
    so, and counts every process's episodes once), writes one log and one checkpoint; the run
    resumes in a single process."""
    run = tmp_path / "run"
    out = _torchrun(["train.py", "--env=webshop", "--model=tiny", "--preset=none", "--iterations=2", "--groups=2",
                     "--group-size=2", "--max-steps=2", "--max-new-tokens=6", "--lora-r=4", "--eval-every=0",
                     "--hindsight=expert", f"--output-dir={run}"])
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["iteration"] for m in lines] == [1, 2]
    assert all(m["processes"] == 2 and m["episodes"] == 4 for m in lines)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["iter-000001", "iter-000002"]
    resumed = subprocess.run([sys.executable, "train.py", "--resume", str(run), "--iterations", "3"], cwd=ROOT,
                             env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    last = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["iteration"] == 3 and last["processes"] == 1


def test_each_process_destroys_its_process_group_before_the_interpreter_ends(tmp_path):
    """A process that leaves its gloo process group to the interpreter's teardown can abort there
    ("terminate called without an active exception"), and torchrun then kills the others: CI once
    lost the two-process test that way, after its update. DataParallel destroys the group at exit,
    while the interpreter is whole; a handler registered before it runs after it and looks."""
    script = tmp_path / "exits.py"
    script.write_text(
        "import atexit, os, sys, torch\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from infra.distributed import DataParallel\n"
        f"seen = {str(tmp_path)!r} + '/rank' + os.environ['RANK']\n"
        "atexit.register(lambda: open(seen, 'w').write(str(torch.distributed.is_initialized())))\n"
        "dp = DataParallel()\n"
        "assert dp.world == 2 and dp.sum(1.0) == 2.0\n")
    out = _torchrun([str(script)])
    assert out.returncode == 0, out.stderr[-3000:]
    assert [(tmp_path / f"rank{r}").read_text() for r in (0, 1)] == ["False", "False"]


class _Reached(Exception):
    """The spy's way to end a collective that was given what NCCL accepts."""


def _nccl_like(dp, monkeypatch):
    """Stand-ins for torch.distributed's collectives that behave as NCCL does about devices: a
    tensor off the process's device is refused with NCCL's error; one on it ends the call."""
    def all_reduce(tensor, *a, **k):
        mine = torch.device(dp.device)
        if tensor.device.type != mine.type or (mine.index is not None and tensor.device.index != mine.index):
            raise RuntimeError(f"No backend type associated with device type {tensor.device.type}")
        raise _Reached(tensor)

    def barrier(*a, device_ids=None, **k):
        if torch.device(dp.device).type == "cuda" and device_ids != [torch.device(dp.device).index]:
            raise RuntimeError(f"barrier on an unnamed GPU (device_ids={device_ids}); this process owns {dp.device}")
        raise _Reached(device_ids)

    monkeypatch.setattr(torch.distributed, "all_reduce", all_reduce)
    monkeypatch.setattr(torch.distributed, "barrier", barrier)


def _two_process_view(device):
    from infra.distributed import DataParallel
    dp = DataParallel()  # WORLD_SIZE unset: a plain process; then made to look like rank 0 of 2 on `device`
    dp.world, dp.rank, dp.device = 2, 0, device
    return dp


def test_every_collective_runs_on_the_process_device(monkeypatch):
    """On GPUs the process group is NCCL, which reduces only tensors on the process's GPU. A CPU
    test cannot hold a GPU tensor, so the process's device is `meta` here (any device but the CPU
    shows the mistake) and the spies refuse, as NCCL does, a tensor anywhere else: the token count
    that train.py sums for every minibatch once went through a CPU float64 tensor, which crashed
    every multi-GPU run at its first update."""
    dp = _two_process_view("meta")
    _nccl_like(dp, monkeypatch)
    with pytest.raises(_Reached) as hit:
        dp.sum(3)
    assert hit.value.args[0].device.type == "meta" and hit.value.args[0].dtype == torch.float64

    grads = [torch.nn.Parameter(torch.zeros(2, 3, device="meta")), torch.nn.Parameter(torch.zeros(4, device="meta"))]
    grads[0].grad = torch.zeros(2, 3, device="meta")  # the second has none: a zero gradient is made, on its device
    with pytest.raises(_Reached) as hit:
        dp.sum_grads(grads)
    assert hit.value.args[0].device.type == "meta"
    with pytest.raises(RuntimeError, match="on cpu, not on this process's meta"):
        dp.sum_grads([torch.nn.Parameter(torch.zeros(2))])  # a gradient left on the CPU is named, not sent

    gpu = _two_process_view("cuda:1")  # a torch.device needs no GPU to exist
    _nccl_like(gpu, monkeypatch)
    with pytest.raises(_Reached) as hit:
        gpu.barrier()
    assert hit.value.args[0] == [1]

    cpu = _two_process_view("cpu")  # gloo: CPU tensors, and a barrier with no device named
    _nccl_like(cpu, monkeypatch)
    with pytest.raises(_Reached) as hit:
        cpu.sum(1.5)
    assert hit.value.args[0].device.type == "cpu"
    with pytest.raises(_Reached) as hit:
        cpu.barrier()
    assert hit.value.args[0] is None
