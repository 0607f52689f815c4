"""Workers: play a batched env's episodes in N worker processes, behind the same interface.

ALFWorld's engine is pure Python and steps one episode at a time; at verl-agent's batch
(16 groups x 8 = 128 episodes, up to 50 turns) the engine, not the model, would set the pace.
`WorkerEnv` splits the batch into N contiguous slices (so the G copies of one game mostly stay
in one worker, which keeps its pool of engines per game) and sends each worker process its
slice; `reset(task_ids)` and `step(responses)` send all slices first and then gather the
answers in episode order, so the workers run at the same time. Everything else (tasks, task
types, expert plans, prompts) is answered by an in-process copy of the env, which plays no
episode. rollout.py does not know the difference.

A worker that dies (the engine crashing the process, a kill), falls silent (a frozen or stopped
process: while it works, a thread of it sends a heartbeat every HEARTBEAT_S seconds, and SILENCE_S
seconds without one, 20 at the defaults, mean it is frozen), or gives no answer within `timeout`
seconds (--env-timeout: a bound on one reset or step however alive the worker is) is reported on
stderr with the game files it held, killed and started anew; its episodes end there as failed
episodes (done, not won, reward 0, info["env_crash"] = True), counted in `crashes`, and the run goes
on. Why a heartbeat: a step takes 20-50 ms and a reset of a batch seconds, 10x that on a loaded
machine, so no timeout fits both a fresh engine and a frozen one; a process that beats is alive,
and one silent for ten beats is not (a sleeping thread is woken within milliseconds even on a
2-core machine at full load: tests/test_workers.py measures it).

`seconds` counts wall time in reset/step as seen from the training process (what the GPU
waits for); the workers' own engine time is `worker_seconds`.
"""
from __future__ import annotations

import contextlib
import multiprocessing as mp
import signal
import sys
import threading
import time

from envs import Env, EnvStep, check_responses
from errors import DataError


HEARTBEAT_S = 2.0  # a working worker says it is alive this often
SILENCE_S = 20.0  # this long without a word (ten beats missed) and a worker counts as frozen


def _serve(conn, env_class: type, kwargs: dict) -> None:
    """A worker's loop: build the env (env_class(**kwargs)), then answer reset / step / close until told to stop; while it
    computes an answer, a thread sends ("beat", None) every HEARTBEAT_S seconds."""
    lock = threading.Lock()  # one message on the pipe at a time

    def send(message):
        with lock:
            conn.send(message)

    try:
        with beating(send):  # building the env (imports, data) can take seconds
            env = env_class(**kwargs)
        while True:
            command, payload = conn.recv()
            if command == "close":
                env.close()
                send(None)
                return
            with beating(send):
                try:
                    answer = env.reset(payload) if command == "reset" else env.step(payload)
                except DataError as err:  # a game the engine cannot play: the parent stops with this line
                    answer = err
            send(("answer", (answer, dict(env.seconds))))
    except (EOFError, BrokenPipeError, ConnectionResetError, KeyboardInterrupt):
        return  # the parent is gone (it stopped on an error, was interrupted or killed): leave quietly


@contextlib.contextmanager
def main_script_left_out(env_class: type):
    """While a worker starts: the parent's main script hidden from spawn, which would otherwise run it
    again in the new process (as `__mp_main__`), to find what it defines. A worker needs only
    envs/, and train.py's imports (torch, transformers, peft) took ~5 s of a core in each worker
    while the parent loaded its model on the same 2 cores. Kept when the env class itself is defined
    in the main script (the worker must import it from there)."""
    main = sys.modules["__main__"]
    if env_class.__module__ == "__main__":
        yield
        return
    hidden = {name: main.__dict__.get(name) for name in ("__file__", "__spec__") if name in main.__dict__}
    main.__dict__.pop("__file__", None)
    main.__spec__ = None
    try:
        yield  # spawn finds neither a path nor a module name for the main script: it imports nothing of it
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(hidden)


@contextlib.contextmanager
def beating(send):
    """Send ("beat", None) every HEARTBEAT_S seconds while the block works (never while idle: a
    parent busy elsewhere for hours would find the pipe full of beats)."""
    done = threading.Event()

    def beat():
        while not done.wait(HEARTBEAT_S):
            try:
                send(("beat", None))
            except (BrokenPipeError, ConnectionResetError, EOFError, OSError):
                return

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


class WorkerEnv(Env):
    """A batched env of class `env_class` (built with **kwargs) whose episodes run in `workers`
    processes (see the module docstring)."""

    def __init__(self, env_class: type, workers: int, timeout: float = 600.0, **kwargs):
        self.local = env_class(**kwargs)  # answers everything but reset/step; plays no episode
        for attr in Env.__annotations__:  # the class attributes of the interface: the env's own
            setattr(self, attr, getattr(self.local, attr))
        super().__init__(max_steps=self.local.max_steps)  # seconds: wall time seen from this process
        self.timeout = timeout  # seconds a worker may take to answer one reset or step (--env-timeout)
        self.silence = SILENCE_S  # seconds without a heartbeat that make a worker frozen
        self._env_class, self._kwargs, self.n = env_class, kwargs, workers
        self._ctx = mp.get_context("spawn")  # a fresh interpreter: no torch threads or model state forked
        self._procs: list = [None] * workers
        self._conns: list = [None] * workers
        for k in range(workers):
            self._start(k)
        self._slices: list[range] = []
        self._task_ids: list[str] = []
        self._dead: set[int] = set()  # workers whose episodes ended in a crash (until the next reset)
        self.worker_seconds = [{"reset": 0.0, "step": 0.0} for _ in range(workers)]

    # -- what the in-process copy answers
    def tasks(self, split):
        return self.local.tasks(split)

    def task_type(self, task_id):
        return self.local.task_type(task_id)

    def expert_plan(self, task_id):
        return self.local.expert_plan(task_id)

    def data_digest(self):
        return self.local.data_digest()

    def build_messages(self, state, history, history_len):
        return self.local.build_messages(state, history, history_len)

    def planner_plans(self, task_id, actions):
        return self.local.planner_plans(task_id, actions)

    def valid(self, state, text):
        return self.local.valid(state, text)

    # -- workers
    def _start(self, k: int) -> None:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_serve, args=(child, self._env_class, self._kwargs), daemon=True)
        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None  # the worker inherits "ignore":
        try:  # Ctrl-C reaches the whole process group, but stopping is the parent's to do (it closes the workers)
            with main_script_left_out(self._env_class):
                proc.start()
        finally:
            if main:
                signal.signal(signal.SIGINT, previous)
        child.close()
        self._procs[k], self._conns[k] = proc, parent

    def _crashed(self, k: int, why: str) -> None:
        tasks = sorted({self._task_ids[j] for j in self._slices[k]})
        print(f"warning: env worker {k} died ({why}) holding the tasks {', '.join(tasks)}; its episodes end as failed, "
              "and the worker is started again", file=sys.stderr)
        self.crashes += 1
        self._dead.add(k)
        if self._procs[k].is_alive():
            self._procs[k].kill()
        self._procs[k].join(timeout=5)
        self._start(k)

    def _call(self, command: str, payloads: dict[int, list]) -> dict[int, list | None]:
        """Send each worker its payload, then gather; a worker that died answers None."""
        sent = {}
        for k, payload in payloads.items():
            try:
                self._conns[k].send((command, payload))
                sent[k] = True
            except (BrokenPipeError, ConnectionResetError, EOFError, OSError) as err:
                self._crashed(k, type(err).__name__)
        out: dict[int, list | None] = {}
        for k in payloads:
            if k not in sent:
                out[k] = None
                continue
            try:
                reply = self._wait(k)
                if reply is None:
                    out[k] = None
                    continue
                answer, seconds = reply
                self.worker_seconds[k] = seconds
                out[k] = answer
                if isinstance(answer, DataError):
                    raise answer  # bad data, not a crash: the same error an in-process env raises
            except (EOFError, ConnectionResetError, OSError) as err:
                self._crashed(k, f"{type(err).__name__}, exit code {self._procs[k].exitcode}")
                out[k] = None
        return out

    def _wait(self, k: int):
        """Worker k's answer, or None after it was found frozen (silent for SILENCE_S) or slower than the
        timeout (then it is killed and started anew): heartbeats are read and waited past."""
        start = time.perf_counter()
        while True:
            left = self.timeout - (time.perf_counter() - start)
            if left <= 0:
                self._crashed(k, f"no answer in {self.timeout:g} s")
                return None
            if not self._conns[k].poll(min(self.silence, left)):
                if self.silence < left:
                    self._crashed(k, f"silent for {self.silence:g} s: frozen or stopped")
                    return None
                continue  # the timeout's end: said above
            kind, body = self._conns[k].recv()
            if kind == "answer":
                return body

    def _failed(self, j: int) -> EnvStep:
        """Episode j ends here: its worker died (done, not won, reward 0)."""
        return EnvStep("The environment crashed; the episode ends.", [], 0.0, True, False, False, "",
                       self.local.task_type(self._task_ids[j]), None, None, {"env_crash": True})

    # -- episodes
    def reset(self, task_ids: list[str]) -> list[EnvStep]:
        t0 = time.perf_counter()
        B = len(task_ids)
        self._task_ids = list(task_ids)
        self._slices = [range(k * B // self.n, (k + 1) * B // self.n) for k in range(self.n)]
        self._dead = set()
        answers = self._call("reset", {k: [task_ids[j] for j in s] for k, s in enumerate(self._slices) if len(s)})
        out: list[EnvStep] = []
        for k, s in enumerate(self._slices):
            if len(s):
                out += answers[k] if answers[k] is not None else [self._failed(j) for j in s]
        self._done = [state.done for state in out]
        self.seconds["reset"] += time.perf_counter() - t0
        self.counts["reset"] += B
        return out

    def step(self, responses: list[str | None]) -> list[EnvStep | None]:
        check_responses(responses, self._done)
        t0 = time.perf_counter()
        live = {k: [responses[j] for j in s] for k, s in enumerate(self._slices)
                if len(s) and k not in self._dead and any(responses[j] is not None for j in s)}
        answers = self._call("step", live)
        out: list[EnvStep | None] = [None] * len(responses)
        for k, s in enumerate(self._slices):
            for i, j in enumerate(s):
                if responses[j] is None:
                    continue
                if k in live and answers[k] is not None:
                    out[j] = answers[k][i]
                else:
                    out[j] = self._failed(j)
                self._done[j] = out[j].done
        self.seconds["step"] += time.perf_counter() - t0
        self.counts["step"] += sum(r is not None for r in responses)
        return out

    def close(self) -> None:
        for k, conn in enumerate(self._conns):
            try:
                conn.send(("close", None))
                if conn.poll(10):
                    conn.recv()
            except (BrokenPipeError, ConnectionResetError, EOFError, OSError):
                pass
            self._procs[k].join(timeout=10)
            if self._procs[k].is_alive():
                self._procs[k].kill()
        self.local.close()
