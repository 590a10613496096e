"""`toolkit spec check|show|from-deepspeed`: validate specs and adopt DeepSpeed configs.

toolkit spec check train.yaml                 one line: valid, and what it resolves to
toolkit spec show train.yaml                  the full spec with every default, as YAML
toolkit spec schema [-o FILE]                 the spec's JSON Schema (docs/spec.schema.json)
toolkit spec reference [-o FILE]              the reference page (docs/spec-reference.md)
toolkit spec from-deepspeed ds.json [-o F] [--world-size N] [--set KEY=VALUE ...] [--lossy]
    a spec from an existing DeepSpeed config. Every key is carried into the spec or refused
    by name (exit 2); --lossy imports anyway and lists each dropped key, with its value, in a
    comment block at the top of the spec. --set fills Hugging Face's "auto" values (a dotted
    DeepSpeed key, e.g. --set optimizer.params.lr=3e-5). Defaults written out are noted on stderr.
"""

from __future__ import annotations

import argparse
from typing import Any

from toolkit.commands._output import add_output, emit, positive_ranks, warn
from toolkit.render.deepspeed_import import Imported, spec_from_deepspeed
from toolkit.render.deepspeed_input import apply_settings
from toolkit.spec import dump_spec, load_spec
from toolkit.spec.load import read_document
from toolkit.spec.schema import schema_text
from toolkit.userfiles import MIB

DEEPSPEED_CONFIG_LIMIT = 1 * MIB
"""Largest DeepSpeed config read (real ones are a few KiB)."""


def _check(args: argparse.Namespace) -> int:
    spec = load_spec(args.file)
    name = args.file if args.file.isprintable() else repr(args.file)
    head = f"ok: {name}: backend {spec.backend} ({spec.framework_name}), launcher {spec.launcher}"
    if spec.fixed_world_size is None:
        print(f"{head}, ranks from the launcher (the batch is checked against them at start)")
        return 0
    batch = spec.batch_for()
    print(
        f"{head}, {spec.world_size} ranks, batch {batch.global_} = micro {batch.micro}"
        f" x accumulation {batch.accumulation} x {batch.dp} data-parallel ranks"
    )
    return 0


def _show(args: argparse.Namespace) -> int:
    emit(dump_spec(load_spec(args.file)), args.output)
    return 0


def _schema(args: argparse.Namespace) -> int:
    emit(schema_text(), args.output)
    return 0


def _reference(args: argparse.Namespace) -> int:
    from toolkit.spec.reference import reference_text

    emit(reference_text(), args.output)
    return 0


def _from_deepspeed(args: argparse.Namespace) -> int:
    config = read_document(
        args.file, what="DeepSpeed config", field="deepspeed", limit=DEEPSPEED_CONFIG_LIMIT
    )
    data = apply_settings(config.data, args.set)
    imported = spec_from_deepspeed(data, world_size=args.world_size, lossy=args.lossy)
    for message in imported.warnings:
        warn(message)
    name = args.file if args.file.isprintable() else repr(args.file)
    emit(_header(name, imported) + dump_spec(imported.data), args.output)
    return 0


def _header(name: str, imported: Imported) -> str:
    """The comment block on top of an imported spec: where from, what was left out because it
    changes no math, the importer's notes, and (--lossy) what was dropped."""
    lines = [f"# Imported from {name} by `toolkit spec from-deepspeed`."]
    if imported.left_out:
        lines.append("# Left out, as they change no math:")
        lines += [f"#   {item.comment()}" for item in imported.left_out]
    if imported.warnings:
        lines.append("# Notes:")
        lines += [f"#   {_comment(message)}" for message in imported.warnings]
    if imported.dropped:
        lines.append("# --lossy: these DeepSpeed keys were NOT carried into this spec:")
        lines += [f"#   {item.comment()}" for item in imported.dropped]
        warn(f"--lossy: dropped {len(imported.dropped)} keys, listed at the top of the spec")
    return "\n".join(lines) + "\n"


def _comment(text: str) -> str:
    """One comment line: a note may quote a user's value, so nothing unprintable passes."""
    return text if text.isprintable() else repr(text)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("spec", help="check specs, import DeepSpeed configs")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    check = actions.add_parser("check", help="validate a spec")
    check.add_argument("file")
    check.set_defaults(func=_check)
    show = actions.add_parser("show", help="print a spec with every default filled in")
    show.add_argument("file")
    add_output(show)
    show.set_defaults(func=_show)
    schema = actions.add_parser("schema", help="print the spec's JSON Schema (for editors)")
    add_output(schema)
    schema.set_defaults(func=_schema)
    reference = actions.add_parser("reference", help="print the spec reference page (Markdown)")
    add_output(reference)
    reference.set_defaults(func=_reference)
    ds = actions.add_parser("from-deepspeed", help="turn a DeepSpeed config into a spec")
    ds.add_argument("file", help="ds_config.json")
    ds.add_argument("--world-size", type=positive_ranks, help="ranks the config was used with")
    ds.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help='set a DeepSpeed key first (fills "auto"); repeatable',
    )
    ds.add_argument(
        "--lossy",
        action="store_true",
        help="import keys the spec does not model anyway, listing them in the spec",
    )
    add_output(ds)
    ds.set_defaults(func=_from_deepspeed)
