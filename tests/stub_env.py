"""A tiny scripted env for training tests: rewards depend on the sampled text, so groups differ."""
from envs import Env, EnvStep


class StubEnv(Env):
    """Two tasks, episodes of `max_steps` turns; a step pays 10 when the response text has an
    even number of characters (a coin flip for a random model), else 0, and ends the episode."""

    name = "stub"
    splits = ("train", "test")
    default_eval_split = "test"
    default_max_steps = 2
    prompt_tokens = 64

    def __init__(self, max_steps: int = 2, data_dir=None):  # StubEnv(2), or as envs/make.py builds it
        super().__init__(data_dir, max_steps)

    def valid(self, state, text):
        return True

    def tasks(self, split):
        return ["task-a", "task-b"]

    def task_type(self, task_id):
        return "stub"

    def expert_plan(self, task_id):
        return ["look", "win"]

    def build_messages(self, state, history, history_len):
        past = " | ".join(a for _, a in history)
        return [{"role": "user", "content": f"Task: {state.task}. Past: {past}. Now: {state.observation}"}]

    def reset(self, task_ids):
        self.steps = [0] * len(task_ids)
        self.done = [False] * len(task_ids)
        return [EnvStep("start", ["look", "win"], 0.0, False, False, False, t, "stub", "win") for t in task_ids]

    def step(self, responses):
        out = []
        for i, text in enumerate(responses):
            if text is None:
                out.append(None)
                continue
            self.steps[i] += 1
            won = len(text) % 2 == 0
            self.done[i] = won or self.steps[i] >= self.max_steps
            out.append(EnvStep(f"obs {self.steps[i]}", ["look", "win"], 10.0 if won else 0.0, self.done[i], won,
                               False, "stub task", "stub", "win", action="look"))
        return out

    def close(self):
        pass
