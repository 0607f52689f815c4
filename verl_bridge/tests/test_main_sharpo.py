"""verl_bridge/main_sharpo.py, the launcher, without Ray (its run needs rollout servers, GPUs): the
config checks refuse what it does not run, and its TaskRunner builds the SHARPO trainer where
verl's builds RayPPOTrainer."""
import pytest
from hydra import compose, initialize_config_dir

import verl.trainer.config as verl_config
from verl.trainer import main_ppo_v0
from verl_bridge.main_sharpo import SharpoTaskRunner, check_config
from verl_bridge.sharpo_trainer import SharpoRayPPOTrainer


def config_with(*overrides):
    with initialize_config_dir(config_dir=str(verl_config.__path__[0]), version_base=None):
        return compose(config_name="ppo_trainer", overrides=["algorithm.adv_estimator=grpo", "trainer.use_v1=False", *overrides])


def test_check_config_refuses_what_the_launcher_does_not_run():
    """v1, a critic's estimator, an unknown or unusable sharpo setting: each a ValueError naming the fix."""
    assert check_config(config_with("+sharpo.layout=per_trajectory", "+sharpo.lam=0.3")).lam == 0.3
    for overrides, message in ((["trainer.use_v1=True"], "use_v1=False"),
                               (["algorithm.adv_estimator=gae"], "adv_estimator=grpo"),
                               (["+sharpo.lamda=0.3"], "unknown setting"),
                               (["+sharpo.layout=per_trajectory", "+sharpo.eps_m=1.5"], "eps_m"),
                               (["+sharpo.layout=per_turn"], "layout must be one of 'per_step', 'per_trajectory'"),
                               (["+sharpo.layout=per_step"], "balance_batch=False"),
                               # settings that trained something else, or failed only after the
                               # first GPU rollout (in the first _update_actor)
                               (["+sharpo.layout=per_trajectory", "+sharpo.granularity=tokens"], "granularity"),
                               (["+sharpo.layout=per_trajectory", "+sharpo.granularity=Token"], "granularity"),
                               (["+sharpo.layout=per_trajectory", "+sharpo.shape=sigmod"], "shape"),
                               (["+sharpo.layout=per_trajectory", "+sharpo.episode_stats=steps"], "episode_stats"),
                               (["+sharpo.layout=per_trajectory", "+sharpo.action_pattern='<action>'"], "one group"),
                               (["+sharpo.layout=per_trajectory", "+sharpo.action_pattern='(unclosed'"],
                                "no regular expression"),
                               (["+sharpo.layout=per_trajectory", "+sharpo.success_above=nan"], "finite number"),
                               (["+sharpo.layout=per_trajectory", "+sharpo.plan_key=''"], "plan_key")):
        with pytest.raises(ValueError, match=message):
            check_config(config_with(*overrides))


def test_the_task_runner_builds_the_sharpo_trainer(monkeypatch):
    """SharpoTaskRunner.run hands the config to verl's TaskRunner.run with the module's trainer name
    pointing at SharpoRayPPOTrainer (verl's run is replaced by a probe: it would start vLLM)."""
    seen = {}
    monkeypatch.setattr(main_ppo_v0.TaskRunner.__ray_actor_class__, "run",
                        lambda self, config: seen.update(trainer=main_ppo_v0.RayPPOTrainer, config=config))
    monkeypatch.setattr(main_ppo_v0, "RayPPOTrainer", main_ppo_v0.RayPPOTrainer)  # restored after the test
    runner = SharpoTaskRunner.__ray_actor_class__.__new__(SharpoTaskRunner.__ray_actor_class__)
    config = config_with("+sharpo.layout=per_trajectory")
    runner.run(config)
    assert seen == {"trainer": SharpoRayPPOTrainer, "config": config}
