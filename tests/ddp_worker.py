"""Run by tests/test_distributed.py under `torchrun --nproc_per_node 2`: one distributed update
over each process's groups; the main process saves every process's trajectories and the LoRA
weights before and after, so the test can redo the update in one process over the same groups."""
import pickle
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
torch.set_num_threads(1)

import train  # noqa: E402
from stub_env import StubEnv  # noqa: E402

out = Path(sys.argv[1])
args = train.parse_args(["--model=tiny", "--preset=none", "--groups=4", "--group-size=4", "--max-steps=1",
                         "--max-new-tokens=8", "--minibatches=1", "--micro-batch-rows=2", "--lr=1e-2", "--lora-r=4",
                         "--lora-alpha=8", "--hindsight=expert", "--kl-coef=0.01", "--eval-every=0", "--seed=11",
                         "--dtype=fp32",  # float32: compared with one process at 1e-6
                         f"--output-dir={out}/run"])
trainer = train.Trainer(args, env=StubEnv(1))
before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" in n}
trajs = trainer.rollout(1)
everyone = trainer.dist.gather(trajs)
rows = trainer.segments(trajs)
adv = trainer.advantage(trajs, rows)
logp = trainer.logprobs(rows, adv)
stats = trainer.update(rows, adv, logp, trainer.credit(rows, adv, logp))
after = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" in n}
first_moment = [trainer.optimizer.state[p]["exp_avg"].clone() for p in trainer.params]  # (1 - beta1) * gradient
if trainer.dist.main:
    with open(out / "ddp.pkl", "wb") as f:
        pickle.dump({"trajs": everyone, "before": before, "after": after, "world": trainer.dist.world,
                     "groups": sorted({t.group for t in trajs}), "stats": stats, "exp_avg": first_moment}, f)
