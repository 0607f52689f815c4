"""Short training runs for tests: the tiny random model on the scripted StubEnv (seconds each)."""
import train
from stub_env import StubEnv


def tiny_args(out, **kw) -> "train.TrainArgs":
    """train.py's flags for a 3-iteration tiny run into `out`, with `kw` overriding."""
    base = dict(model="tiny", preset="none", iterations=3, groups=2, group_size=4, max_steps=2, max_new_tokens=8,
                lr=1e-2, lora_r=4, lora_alpha=8, eval_every=0, hindsight="expert", seed=5, output_dir=str(out))
    base.update(kw)
    return train.parse_args(flags(**base))


def tiny_train(args) -> tuple[list[dict], "train.Trainer"]:
    """Run (or resume) `args` on the StubEnv; returns (metrics of the iterations run, trainer)."""
    trainer = train.Trainer(args, env=StubEnv(args.max_steps))
    return train.train(args, trainer), trainer


def flags(**kw) -> list[str]:
    """train.py's command line for these flag values (True and False: a boolean flag given or negated)."""
    names = {k: k.replace("_", "-") for k in kw}
    return [f"--{names[k]}" if v is True else f"--no-{names[k]}" if v is False else f"--{names[k]}={v}"
            for k, v in kw.items()]


def tiny_run_folder(tmp_path, name="run", **kw):
    """A finished 1-iteration tiny run on the stub env; returns its folder."""
    base = dict(model="tiny", preset="none", iterations=1, groups=2, group_size=2, max_steps=2, max_new_tokens=6,
                lora_r=4, lora_alpha=8, eval_every=0, hindsight="expert", lr=1e-2, seed=7,
                output_dir=str(tmp_path / name))
    base.update(kw)
    args = train.parse_args(flags(**base))
    train.train(args, train.Trainer(args, env=StubEnv(args.max_steps)))
    return tmp_path / name
