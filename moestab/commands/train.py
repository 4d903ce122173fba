"""``moestab train``: parse the config (YAML + flags), run the loop, print a closing summary."""

from __future__ import annotations

import argparse

HELP = "RL fine-tune an MoE policy (GSPO/GRPO/...) with Routing Replay off / old (R2) / rollout (R3)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from moestab.configs import add_config_arguments
    from moestab.train.config import TrainConfig

    parser.add_argument("--config", metavar="YAML", help="YAML file of config fields; flags override it")
    add_config_arguments(parser, TrainConfig)


def run(args: argparse.Namespace) -> int:
    from transformers.utils import logging as hf_logging

    from moestab.configs import ConfigError, build_config, load_yaml
    from moestab.routing import RoutingError
    from moestab.tasks import TaskError
    from moestab.train import TrainConfig, TrainingError, train

    hf_logging.disable_progress_bar()  # per-checkpoint load/save bars would drown the training bar
    flags = {k: v for k, v in vars(args).items() if not k.startswith("_") and k not in ("command", "config")}
    try:
        config = build_config(TrainConfig, load_yaml(args.config) if args.config else {}, flags)
        result = train(config)
    except (ConfigError, TrainingError, TaskError, RoutingError) as exc:
        print(f"moestab train: error: {exc}")
        return 2
    start = f"{result.start_accuracy:.1%}" if result.start_accuracy is not None else "n/a"
    final = f"{result.final_accuracy:.1%}" if result.final_accuracy is not None else "n/a"
    print(f"\nrun {result.status} at step {result.last_step}: {result.run_dir}")
    print(f"eval accuracy: start {start} -> final {final}")
    print(f"analyze:   moestab analyze {result.run_dir}")
    print(f"dashboard: moestab dashboard {result.run_dir.parent}")
    return 0 if result.status in ("finished", "interrupted") else 1
