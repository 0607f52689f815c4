"""ALFWorld episodes in worker processes (envs/workers.py): the same trajectories as in-process,
a dead worker ends its episodes as failures and is replaced, --env-workers 1 is today's path."""
import os
import signal
import subprocess
import sys
import time

import pytest

from envs.make import make_env, resolve_workers
from envs.alfworld import AlfWorldEnv
from envs.webshop import WebShopEnv
from envs.workers import WorkerEnv
from eval import RandomPolicy
from rollout import play_episodes


def _play(env, tasks):
    trajs = play_episodes(env, tasks, RandomPolicy(3), history_len=2)
    return [[(s.messages[0]["content"], s.action, s.reward, s.anchor) for s in t.steps] + [t.won] for t in trajs]


def test_two_workers_play_exactly_the_in_process_episodes():
    """A seeded random policy over 2 games x 3 episodes (split unevenly over the workers): the
    prompts, actions, rewards and outcomes are identical with 1 and with 2 workers, and again
    on a second batch (engines reused from the workers' pools)."""
    local = make_env("alfworld", max_steps=4, workers=1)
    assert isinstance(local, AlfWorldEnv)
    tasks = [t for t in local.tasks("train")[:2] for _ in range(3)]
    parallel = make_env("alfworld", max_steps=4, workers=2)
    assert isinstance(parallel, WorkerEnv)
    try:
        for _ in range(2):
            assert _play(parallel, tasks) == _play(local, tasks)
        assert parallel.counts["reset"] == 12 and parallel.crashes == 0
    finally:
        parallel.close()
        local.close()


def test_a_dead_worker_ends_its_episodes_and_is_replaced(capsys):
    env = WorkerEnv(AlfWorldEnv, 2, max_steps=3)
    try:
        tasks = env.tasks("train")[:2]
        states = env.reset([tasks[0], tasks[0], tasks[1], tasks[1]])
        os.kill(env._procs[1].pid, signal.SIGKILL)  # the worker holding episodes 2 and 3
        env._procs[1].join(timeout=10)
        answers = env.step(["<think>x</think><action>look</action>"] * 4)
        assert [a.done for a in answers] == [False, False, True, True]
        assert answers[2].info["env_crash"] and not answers[2].won and answers[2].reward == 0.0
        assert env.crashes == 1
        err = capsys.readouterr().err
        assert "worker 1 died" in err and tasks[1] in err
        assert env.step(["<think>x</think><action>look</action>"] * 2 + [None, None])[2] is None
        states = env.reset([tasks[1]] * 4)  # the replacement worker plays the next batch
        assert len(states) == 4 and not any(s.done for s in states)
        assert all(a is not None for a in env.step(["<think>x</think><action>look</action>"] * 4))
    finally:
        env.close()


def test_a_ctrl_c_is_the_parents_to_handle_not_the_workers():
    """Ctrl-C reaches every process of the terminal's group. The workers start with SIGINT ignored
    (so none prints a KeyboardInterrupt traceback while it starts or plays), keep answering, and
    the parent's own handler is back in place after they start."""
    before = signal.getsignal(signal.SIGINT)
    env = WorkerEnv(AlfWorldEnv, 1, max_steps=3)
    try:
        task = env.tasks("train")[0]
        env.reset([task])  # the worker is started here
        assert signal.getsignal(signal.SIGINT) is before
        os.kill(env._procs[0].pid, signal.SIGINT)
        time.sleep(0.5)
        assert env._procs[0].is_alive()
        assert env.step(["<think>x</think><action>look</action>"])[0] is not None and env.crashes == 0
    finally:
        env.close()


def test_worker_counts_and_webshop_in_process():
    """0 = the CPU cores capped by the batch; WebShop ignores workers (a step is ~0.05 ms)."""
    assert resolve_workers(0, 1) == 1 and resolve_workers(3, 1) == 3
    assert resolve_workers(0, 1000) == (os.cpu_count() or 1)
    assert isinstance(make_env("webshop", workers=4), WebShopEnv)


@pytest.mark.slow
def test_a_frozen_worker_is_found_in_20_seconds_at_the_defaults():
    """SIGSTOP one worker mid-episode, with the default --env-timeout (600 s): its heartbeats stop, and it
    counts as crashed after 20 s of silence (it took the whole 600 s before), the other worker goes on."""
    import os
    import signal
    import time

    from envs.make import make_env

    env = make_env("alfworld", workers=2)
    try:
        assert env.timeout == 600 and env.silence == 20
        env.reset(env.tasks("train")[:2])
        os.kill(env._procs[0].pid, signal.SIGSTOP)
        clock = time.perf_counter()
        out = env.step(["<think>x</think><action>look</action>"] * 2)
        assert 19 < time.perf_counter() - clock < 45
        assert out[0].info.get("env_crash") and not out[1].info.get("env_crash") and env.crashes == 1
    finally:
        env.close()


@pytest.mark.slow
def test_heartbeats_keep_coming_on_a_loaded_machine():
    """No false alarm: with both cores busy, a working worker's beats (every 2 s) never fall silent for
    anything near the 20 s that marks it frozen (measured: the largest gap between beats)."""
    import multiprocessing as mp
    import time

    from envs.workers import beating

    hogs = [mp.get_context("spawn").Process(target=_spin, args=(12,), daemon=True) for _ in range(3)]
    for h in hogs:
        h.start()
    stamps = []
    with beating(lambda message: stamps.append(time.perf_counter())):
        end = time.perf_counter() + 10
        while time.perf_counter() < end:  # the worker itself busy too
            sum(range(10000))
    for h in hogs:
        h.join()
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    assert len(stamps) >= 4 and max(gaps) < 5, gaps


def _spin(seconds: float) -> None:
    import time

    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_a_frozen_worker_counts_as_crashed_within_its_timeout():
    """SIGSTOP one of two ALFWorld workers mid-episode: the step returns within the timeout, that worker's episodes
    end as failed, it is killed and started anew, and the other worker's episodes go on."""
    from envs.make import make_env

    env = make_env("alfworld", workers=2, timeout=5)
    try:
        tasks = env.tasks("train")[:2]
        env.reset(tasks)
        os.kill(env._procs[0].pid, signal.SIGSTOP)
        clock = time.perf_counter()
        out = env.step(["<think>x</think><action>look</action>"] * 2)
        assert time.perf_counter() - clock < 30
        assert out[0].info.get("env_crash") and not out[1].info.get("env_crash")
        assert env.crashes == 1 and env._procs[0].is_alive()  # a fresh worker in its place
    finally:
        env.close()


def test_a_worker_does_not_run_the_parents_main_script_again(tmp_path):
    """spawn would run the parent's main script again in each worker (train.py's: torch, transformers,
    peft, ~5 s of a core each); the workers start without it, and still play."""
    ran = tmp_path / "ran"
    script = tmp_path / "main_script.py"
    script.write_text(
        "import os, sys\n"
        f"open({str(ran)!r}, 'a').write(f'{{os.getpid()}}\\n')  # at import: once per process that runs it\n"
        f"sys.path.insert(0, {os.getcwd()!r})\n"
        "if __name__ == '__main__':\n"
        "    from envs.alfworld import AlfWorldEnv\n"
        "    from envs.workers import WorkerEnv\n"
        "    env = WorkerEnv(AlfWorldEnv, 2, max_steps=3)\n"
        "    try:\n"
        "        task = env.tasks('train')[0]\n"
        "        assert all(not s.done for s in env.reset([task, task]))\n"
        "        assert __file__ and __spec__ is None  # the parent's main module as it was\n"
        "    finally:\n"
        "        env.close()\n"
        "    print('played by the workers of', os.getpid())\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "played" in done.stdout, done.stderr
    assert ran.read_text().split() == [done.stdout.split()[-1]]  # the parent's import, no worker's
