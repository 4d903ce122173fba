"""``moestab train``: parse the config (YAML + flags), run the loop, print a closing summary."""

from __future__ import annotations

import argparse

HELP = ("RL fine-tune an MoE policy (GSPO/GRPO/...) with Routing Replay off / old (R2) / rollout (R3) / "
        "rollout-gates (TRR).")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from moestab.configs import add_config_arguments
    from moestab.train.config import TrainConfig

    parser.add_argument("--config", metavar="YAML", help="YAML file of config fields; flags override it")
    add_config_arguments(parser, TrainConfig)


def run(args: argparse.Namespace) -> int:
    import sys
    import traceback

    import torch
    from transformers.utils import logging as hf_logging

    from moestab.configs import ConfigError
    from moestab.routing import RoutingError
    from moestab.run_folder.errors import RunError
    from moestab.run_folder.run_info import read_run_info
    from moestab.tasks import TaskError
    from moestab.text import MESSAGE_LIMIT, clip
    from moestab.train import TrainingError, train
    from moestab.train.config import load_train_config
    from moestab.train.distributed import world_from_env
    from moestab.train.interrupt import exit_status
    from moestab.train.run_lifetime import RunCrashedError

    hf_logging.disable_progress_bar()  # per-checkpoint load/save bars would drown the training bar
    flags = {k: v for k, v in vars(args).items() if not k.startswith("_") and k not in ("command", "config")}
    try:
        config = load_train_config(args.config, flags)  # with --resume: the run's own settings, then these
        if config.nproc > 1 and world_from_env().size == 1:  # start the processes; each runs this command
            from moestab.train.launch import launch

            code, ended_cleanly = launch(config, log=print)
            if not ended_cleanly:
                print(f"moestab train: error: the {config.nproc} training processes failed (torchrun exit status "
                      f"{code}); the first failure is printed above, and {config.run_dir}/run.json records it "
                      "when rank 0 could write it", file=sys.stderr)
            else:
                info = read_run_info(config.run_dir)
                print(f"\nrun {info.status} at step {info.last_step} ({config.nproc} processes): {config.run_dir}")
            return code
        if config.threads:  # the process's environment is the command's to set, not the library's
            torch.set_num_threads(config.threads)
        result = train(config, log=print)  # the run's notes on stdout, as ever
    except (ConfigError, TrainingError, TaskError, RoutingError, RunError) as exc:
        rank = world_from_env().rank
        if rank and getattr(exc, "said_by_rank_0", False):  # rank 0's refusal, raised on every rank: said once
            return 2
        print(f"moestab train{f' (rank {rank})' if rank else ''}: error: {clip(str(exc), MESSAGE_LIMIT)}",
              file=sys.stderr)
        cause = exc.__cause__
        if isinstance(exc, RunCrashedError) and cause is not None and not isinstance(cause, OSError | RunError):
            print("moestab train: the error was raised here:", file=sys.stderr)
            traceback.print_exception(cause, file=sys.stderr)
        return 2
    if world_from_env().rank:
        return exit_status(result.status, result.stop_signal, result.collapse_stop)
    start = f"{result.start_accuracy:.1%}" if result.start_accuracy is not None else "n/a"
    final = f"{result.final_accuracy:.1%}" if result.final_accuracy is not None else "n/a"
    print(f"\nrun {result.status} at step {result.last_step}: {result.run_dir}")
    print(f"eval accuracy: start {start} -> final {final}")
    print(f"analyze:   moestab analyze {result.run_dir}")
    print(f"dashboard: moestab dashboard {result.run_dir.parent}")
    return exit_status(result.status, result.stop_signal, result.collapse_stop)  # 130 / 143 when a signal stopped it
