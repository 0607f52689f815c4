"""Launch verl's PPO trainer with SHARPO's credit: verl 0.9.1's own `main_ppo` on its v0 trainer
path, with `SharpoRayPPOTrainer` (sharpo_trainer.py) in place of `RayPPOTrainer`.

Run (the verl environment, from the repository root, on GPUs; docs/scaling.md has a full command):
    python -m verl_bridge.main_sharpo <verl's ppo_trainer overrides> trainer.use_v1=False \\
        algorithm.adv_estimator=grpo +sharpo.layout=per_trajectory +sharpo.lam=0.5
Deviations from verl's main: `trainer.use_v1=True`, verl 0.9.1's default, is refused (the v1
trainer gets TransferQueue handles, not DataProtos: sharpo_trainer.py's docstring), and the
`sharpo` settings are checked before Ray starts. The repository root goes on the Ray workers'
PYTHONPATH (the TaskRunner imports the trainer from it): on a multi-node cluster the repository
must lie at the same path on every node.
"""
from __future__ import annotations

import os
from pathlib import Path

import hydra
import ray
from omegaconf import OmegaConf
from verl.trainer import main_ppo_v0
from verl.trainer.main_ppo import run_ppo
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import validate_config
from verl.utils.device import auto_set_device

from verl_bridge.sharpo_trainer import SharpoRayPPOTrainer, SharpoSettings

ROOT = Path(__file__).resolve().parent.parent  # the repository root
VERL_ESTIMATOR = "grpo"  # verl's own estimator name (its registry, not train.py's): the critic-free A_i SHARPO replaces


@ray.remote
class SharpoTaskRunner(main_ppo_v0.TaskRunner.__ray_actor_class__):
    """verl's TaskRunner; its `run` builds the trainer by the name `main_ppo_v0.RayPPOTrainer`,
    which names the SHARPO trainer here (in this Ray actor's process only)."""

    def run(self, config):
        main_ppo_v0.RayPPOTrainer = SharpoRayPPOTrainer
        return super().run(config)


def check_config(config) -> SharpoSettings:
    """Refuse what this launcher does not run, before Ray starts: a ValueError says what to change."""
    if config.trainer.get("use_v1", False):
        raise ValueError("main_sharpo runs verl's v0 trainer (RayPPOTrainer): set trainer.use_v1=False. "
                         "The v1 trainer is not covered (verl_bridge/sharpo_trainer.py)")
    if config.algorithm.adv_estimator != VERL_ESTIMATOR:
        raise ValueError("SHARPO replaces the group advantage it computes itself: set algorithm.adv_estimator="
                         f"{VERL_ESTIMATOR} (a critic-free estimator); got {config.algorithm.adv_estimator!r}")
    return SharpoSettings.from_config(config)


@hydra.main(config_path="pkg://verl.trainer.config", config_name="ppo_trainer", version_base=None)
def main(config) -> None:
    auto_set_device(config)
    check_config(config)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    paths = [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    OmegaConf.update(config, "ray_kwargs.ray_init.runtime_env.env_vars.PYTHONPATH", os.pathsep.join(paths),
                     force_add=True)
    run_ppo(config, task_runner_class=SharpoTaskRunner)


if __name__ == "__main__":
    main()
