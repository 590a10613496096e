"""`toolkit config KIND --spec FILE [-o FILE]`: render one engine's or launcher's artifact.

toolkit config deepspeed --spec train.yaml [--world-size N]   ds_config JSON
toolkit config horovod   --spec train.yaml [--env]            horovodrun --config-file YAML
toolkit config tf        --spec train.yaml [--index I]        TF_CONFIG (+ communication)
toolkit config hostfile  --spec train.yaml                    "host slots=N" lines
toolkit config sbatch    --spec train.yaml -- SCRIPT ARGS...  Slurm batch script
toolkit config mpijob    --spec train.yaml -- SCRIPT ARGS...  Kubeflow MPIJob YAML
toolkit config presets   --write DIR | --check DIR            ds_configs/ presets

For a spec with device cuda, the artifacts say how the ranks use the GPUs: the batch script and
the MPIJob in a comment at their top (with their GPU requests), the DeepSpeed config, which
holds no device setting, on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

import yaml

from toolkit.commands._output import add_output, add_spec, emit, positive_ranks
from toolkit.errors import ToolkitError
from toolkit.launch.machine_settings import for_this_machine
from toolkit.render import horovod, tf
from toolkit.render.deepspeed import deepspeed_config
from toolkit.render.hostfile import hostfile
from toolkit.render.layout import device_binding, device_summary
from toolkit.render.mpijob import mpijob_manifest
from toolkit.render.presets import check_or_write
from toolkit.render.slurm import sbatch_script
from toolkit.spec import load_spec


def _deepspeed(args: argparse.Namespace) -> str:
    """Required, not assumed: a DeepSpeed config fixes train_batch_size for one world size and
    DeepSpeed refuses it at start under any other, so rendering for a guessed 1 rank would only
    move the error from here to the job. The spec's launch.np (or hosts) or --world-size says."""
    spec = load_spec(args.spec)
    world = args.world_size or spec.fixed_world_size
    if world is None:
        raise ToolkitError(
            "config deepspeed: the spec fixes no world size (launch.np and launch.hosts unset), "
            "and a DeepSpeed config's batch sizes hold for one world size",
            "pass --world-size N (the ranks deepspeed will start), or set launch.np",
        )
    if spec.device == "cuda":
        print(f"toolkit: device cuda: {device_binding(spec)}", file=sys.stderr)
    return json.dumps(deepspeed_config(spec, world), indent=2)


def _horovod(args: argparse.Namespace) -> str:
    spec = for_this_machine(load_spec(args.spec))
    if args.env:
        return "\n".join(f"{name}={value}" for name, value in horovod.environment(spec).items())
    return yaml.safe_dump(horovod.config_file(spec), sort_keys=False)


def _tf(args: argparse.Namespace) -> str:
    spec = load_spec(args.spec)
    if args.index is not None:
        return tf.tf_config(spec, args.index)
    data = {"communication": tf.communication_options(spec), "tf_config": tf.tf_configs(spec)}
    return json.dumps(data, indent=2)


def _hostfile(args: argparse.Namespace) -> str:
    return hostfile(load_spec(args.spec))


def _sbatch(args: argparse.Namespace) -> str:
    return sbatch_script(load_spec(args.spec), args.command)


def _mpijob(args: argparse.Namespace) -> str:
    spec = load_spec(args.spec)
    manifest = yaml.safe_dump(mpijob_manifest(spec, args.command), sort_keys=False)
    return f"# {device_summary(spec)}\n{manifest}" if spec.device == "cuda" else manifest


def _presets(args: argparse.Namespace) -> int:
    return check_or_write(args.check or args.write, check=bool(args.check))


def _rendering(render: Callable[[argparse.Namespace], str]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        emit(render(args), args.output)
        return 0

    return run


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("config", help="render engine and launcher configuration")
    kinds = parser.add_subparsers(dest="kind", metavar="KIND", required=True)

    def kind(name: str, help_text: str, render: Callable[[argparse.Namespace], str]) -> Any:
        sub = kinds.add_parser(name, help=help_text)
        add_spec(sub)
        add_output(sub)
        sub.set_defaults(func=_rendering(render))
        return sub

    ds = kind("deepspeed", "DeepSpeed config JSON", _deepspeed)
    ds.add_argument(
        "--world-size",
        type=positive_ranks,
        help="ranks to render for (default: launch.np; required without it)",
    )
    hvd = kind("horovod", "horovodrun --config-file YAML", _horovod)
    hvd.add_argument("--env", action="store_true", help="print HOROVOD_* variables instead")
    tf_parser = kind("tf", "TF_CONFIG per worker and communication options", _tf)
    tf_parser.add_argument("--index", type=int, help="print only this worker's TF_CONFIG")
    kind("hostfile", 'hostfile in the deepspeed launcher\'s "host slots=N" form', _hostfile)
    for name, help_text, render in (
        ("sbatch", "Slurm batch script", _sbatch),
        ("mpijob", "Kubeflow MPIJob (v2beta1) manifest", _mpijob),
    ):
        kind(name, help_text, render).add_argument(
            "command", nargs="*", metavar="-- SCRIPT ARGS", help="what each rank runs"
        )
    presets = kinds.add_parser("presets", help="regenerate or check ds_configs/ presets")
    mode = presets.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", metavar="DIR", help="regenerate DIR/<name>.json")
    mode.add_argument("--check", metavar="DIR", help="exit 1 if any DIR/<name>.json is stale")
    presets.set_defaults(func=_presets)
