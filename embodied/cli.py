"""``embodied``: one command line for simulator rollouts, training, evaluation and inference.

Every sub-command explains itself with ``--help``, shows a progress bar for long work, writes results
atomically, and answers bad input with one line on stderr and a non-zero exit:
    1  a batch command (infer over several inputs) skipped some inputs; the others are written
    2  bad input (missing / corrupt file, unknown config key, bad argument)
    130 interrupted

Heavy modules are imported inside the command functions, so ``embodied --help`` is instant.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from core.errors import EmbodiedError

EXIT_BAD_INPUT = 2


def _add_demo(sub) -> None:
    p = sub.add_parser("demo", help="run every part, tiny, on embedded defaults; writes index.html",
                       description="The main job: each built part of the workspace runs tiny on embedded "
                                   "defaults and the results land in OUT/index.html (a page to open).")
    p.add_argument("--out", default="outputs/demo", help="output directory (default: %(default)s)")
    p.add_argument("--only", nargs="*", default=None, help="run only these demo sections (by name)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output folder (on success)")
    p.set_defaults(func=_cmd_demo, rest_dest="only")


def _cmd_demo(args) -> int:
    from core.outputs import claim_output
    from embodied.demo import check_sections, run_demo

    check_sections(args.only)  # unknown names fail before anything is claimed
    with claim_output(args.out, command="demo", overwrite=args.overwrite) as out:
        return run_demo(out, only=args.only, shown=args.out)


def _add_infer(sub) -> None:
    """One sub-command per registered ``InferSpec``."""
    from core.registry import INFER

    p = sub.add_parser("infer", help="image / video inference with a method's model",
                       description="Inference with a trained or shipped checkpoint.")
    kinds = p.add_subparsers(dest="kind", metavar="KIND", required=True)
    for kind in INFER.names():
        helptext, arguments = INFER.meta(kind)["spec"].help, INFER.meta(kind)["spec"].arguments
        k = kinds.add_parser(kind, help=helptext, description=helptext)
        k.add_argument("--checkpoint", default=None, help="checkpoint or exported model folder "
                                                          "(default: the one shipped in assets/)")
        for name, kw in arguments:
            k.add_argument(name, **kw)
        out_kw = next((kw for name, kw in arguments if name == "--out"), None)
        # --out is a FILE.mp4 (the command writes one file atomically, core.outputs.output_file) or a folder
        # (claimed and staged here): the kind's declaration decides, never the value the user typed.
        out_file = out_kw is not None and "." in str(out_kw.get("metavar", ""))
        if out_kw is not None:
            k.add_argument("--overwrite", action="store_true",
                           help=f"replace an existing --out {'file' if out_file else 'folder'} (on success)")
        rest = next((n for n, kw in arguments if not n.startswith("-") and kw.get("nargs") in ("+", "*")),
                    None)
        k.set_defaults(func=_cmd_infer, rest_dest=rest, out_is_file=out_file)


def _cmd_infer(args) -> int:
    from core.registry import INFER

    fn = INFER.get(args.kind)
    if getattr(args, "out", None) is None or getattr(args, "out_is_file", False):
        return fn(args)
    from core.outputs import claim_output, flush_announced

    class NothingWritten(Exception):
        pass

    # The method writes into the claimed (staged) folder and names files by the folder the user gave; the lines
    # naming outputs (core.outputs.announce) are printed once that folder is in place. Exit 1 = some inputs
    # were skipped (each with its error line): the others' outputs are kept; none ran: nothing is written.
    args.out_display, args.announce = Path(args.out), []
    try:
        with claim_output(args.out, command=f"infer {args.kind}", overwrite=args.overwrite) as out:
            args.out = str(out)
            code = fn(args)
            if code and not any(out.iterdir()):
                raise NothingWritten
    except NothingWritten:
        print(f"embodied: infer {args.kind}: no input could be processed; nothing was written", file=sys.stderr)
        return code
    flush_announced(args.announce)
    return code


def _add_sim(sub) -> None:
    p = sub.add_parser("sim", help="simulators: list environments, roll out policies, make datasets",
                       description="Simulator environments (manipulation suite, LIBERO, driving), rollouts "
                                   "that record HDF5 + mp4, and dataset renderers for perception.")
    from sim.cli import configure_parser

    configure_parser(p)


def _add_drive(sub) -> None:
    p = sub.add_parser("drive", help="closed-loop driving evaluation",
                       description="Closed-loop driving evaluation in the highway-env scenarios.")
    d = p.add_subparsers(dest="drive_cmd", metavar="CMD", required=True)
    e = d.add_parser("eval", help="drive N episodes with a policy and report closed-loop metrics",
                     description="Drive N episodes of one scenario (or of all five) with a policy; writes "
                                 "per-episode rows, per-scenario and overall aggregates (Bench2Drive-style "
                                 "driving score DS, success rate SR, collision rate, progress, comfort), "
                                 "summary.md, index.html and videos of the first K episodes. Episode j uses "
                                 "seed + j in every scenario and for every policy (paired rows). An episode "
                                 "in which the policy raises or returns a NaN / wrong-shape action is scored "
                                 "as failed (0) and the run goes on.")
    e.add_argument("--policy", required=True,
                   help="idm (= expert) | constant | random | a registered policy (e.g. automot, noreason) | "
                        "CHECKPOINT | ws://HOST:PORT (a policy served over openpi's websocket protocol, e.g. "
                        "`embodied serve`); the same names as `sim rollout` and `libero eval` (sim.policies)")
    from sim.policies import add_policy_arg
    from sim.remote import add_remote_arguments

    add_policy_arg(e)
    add_remote_arguments(e, _positive_int, "0.2 s")
    e.add_argument("--scenario", default="highway",
                   help="highway | merge | roundabout | intersection | racetrack | all "
                        "(default: %(default)s)")
    e.add_argument("--episodes", type=_positive_int, default=5,
                   help="episodes per scenario (default: %(default)s)")
    e.add_argument("--seed", type=int, default=0, help="episode j uses seed + j (default: %(default)s)")
    e.add_argument("--out", required=True, help="output folder (refused if it holds another run)")
    e.add_argument("--json", action="store_true",
                   help="print every figure (summary.json: scores as fractions, per scenario, abilities, latency) "
                        "instead of the table")
    e.add_argument("--videos", type=_non_negative_int, default=2, metavar="K",
                   help="record videos of the first K episodes of each scenario (default: %(default)s)")
    e.add_argument("--no-video", action="store_true", help="record no video (same as --videos 0)")
    e.add_argument("--horizon-s", type=float, default=None, dest="horizon_s",
                   help="episode length in simulated seconds (default: each scenario's)")
    e.add_argument("--overwrite", action="store_true", help="replace an existing output folder (on success)")
    e.set_defaults(func=_cmd_drive_eval)
    b = d.add_parser("leaderboard", help="several policies on every scenario with paired seeds: one table of DS, "
                                         "SR, PDMS, EPDMS, efficiency, comfortness and latency with intervals",
                     description="Run `drive eval --scenario all` for each row (default: expert, constant, random, "
                                 "the shipped AutoMoT synchronous and asynchronous, AutoMoT without reasoning) on "
                                 "the same episode seeds, then write leaderboard.md / leaderboard.json (95 %% "
                                 "intervals; Bench2Drive's abilities). Rerun the same command to resume.")
    b.add_argument("--out", required=True, help="output folder (resumed when rerun with the same settings)")
    b.add_argument("--episodes", type=_positive_int, default=10, help="episodes per scenario (default: %(default)s)")
    b.add_argument("--seed", type=int, default=0, help="episode j uses seed + j (default: %(default)s)")
    b.add_argument("--row", action="append", default=[], metavar="NAME=POLICY[,k=v...]",
                   help="a row instead of the defaults (repeatable), e.g. 'fast=automot,update_interval=4'")
    b.add_argument("--horizon-s", type=float, default=None, dest="horizon_s",
                   help="episode length in simulated seconds (default: each scenario's)")
    b.add_argument("--overwrite", action="store_true", help="start afresh in a folder that holds another one")
    b.set_defaults(func=_cmd_drive_leaderboard)


def _cmd_drive_eval(args) -> int:
    from driving.evaluate import drive_eval

    return drive_eval(args)


def _cmd_drive_leaderboard(args) -> int:
    from driving.leaderboard import leaderboard_command

    return leaderboard_command(args)


_LIBERO_EVAL = (
    "Evaluate a policy the way VLA papers and lerobot-eval do: one episode per fixed init state "
    "(episode k of a task starts from init state k), the suite's step limit (spatial 220, object "
    "280, goal 300, libero_10 520, libero_90 400 policy steps) after --settle-steps no-op steps "
    "that do not count, success = LIBERO's BDDL goal check. Writes episodes.jsonl (one line per "
    "finished episode), eval_info.json (per task / suite / overall pc_success with Wilson 95 % "
    "intervals), index.html and mp4s of the first episodes. Rerun the same command to resume a "
    "killed evaluation: finished episodes are skipped. A policy that raises or returns a NaN / "
    "wrong-shape action, a diverging simulator or a dying worker fails only its episode. "
    "expert / scripted / random read the sim state and run without camera images.")
_LIBERO_RECORD = (
    "Record demonstrations offline with the privileged expert: for each task, episodes that start "
    "from placements LIBERO's samplers draw (not the 50 evaluation init states) and reach the "
    "BDDL goal, written as <out>/<suite>/<task>_demo.hdf5 in the layout of LIBERO's "
    "create_dataset.py (data/demo_i/{actions, states, robot_states, rewards, dones, "
    "obs/{agentview_rgb, eye_in_hand_rgb, ee_pos, ee_ori, ee_states, gripper_states, "
    "joint_states}} and the env / BDDL attributes), so that LIBERO's downloaded demos and these "
    "go through the same loader and training commands. Failed attempts are not rendered. "
    "Rerun to resume: finished tasks are kept. Exit 1 if a task got fewer demos than asked.")
# `embodied libero CMD`: (name, help, description, module in sim.libero with configure_<name>_parser and <name>_command)
_LIBERO_COMMANDS = (
    ("eval", "success rate per task / suite with Wilson intervals, videos, HTML (resumable)", _LIBERO_EVAL,
     "evaluate"),
    ("record", "successful expert demonstrations per task in LIBERO's own HDF5 demo layout", _LIBERO_RECORD,
     "record"),
)


def _add_libero(sub) -> None:
    import importlib

    p = sub.add_parser("libero", help="the LIBERO benchmark: evaluate a policy with its protocol, record demos",
                       description="The LIBERO benchmark (130 tasks in five suites, 50 fixed init states each).")
    cmds = p.add_subparsers(dest="libero_cmd", metavar="CMD", required=True)
    for name, help_text, description, module in _LIBERO_COMMANDS:
        e = cmds.add_parser(name, help=help_text, description=description)
        mod = importlib.import_module(f"sim.libero.{module}")
        getattr(mod, f"configure_{name}_parser")(e, _positive_int, _non_negative_int)
        e.set_defaults(func=lambda args, mod=mod, name=name: getattr(mod, f"{name}_command")(args))


_SERVE = (
    "Serve a policy over openpi's websocket policy protocol (msgpack with numpy arrays, metadata first, "
    "`actions` chunks back, errors as text frames), so that `--policy ws://HOST:PORT` in libero eval, sim rollout "
    "and drive eval, openpi-client's WebsocketClientPolicy or openpi's own LIBERO example drive it. One policy state "
    "per connection (reset on connect and on {\"reset\": true}); requests of concurrent clients are answered by one "
    "batched forward; GET /healthz answers 200. Binds 127.0.0.1 unless --host says otherwise, and any other address "
    "needs --api-key-file. SIGTERM or Ctrl-C finishes the requests in flight and exits 0.")


def _add_serve(sub) -> None:
    from embodied.serve import configure_parser

    p = sub.add_parser("serve", help="serve a policy over openpi's websocket protocol (for ws:// clients)",
                       description=_SERVE)
    configure_parser(p, _positive_int, _non_negative_int)
    p.set_defaults(func=_cmd_serve)


def _cmd_serve(args) -> int:
    from embodied.serve import serve_command

    return serve_command(args)


def _add_train_eval(sub) -> None:
    from core.registry import method_specs
    from embodied.methods import arm_names

    flags = {f.name: f for spec in method_specs() for f in spec.flags}
    arms = "; ".join(f"{s.name}: {', '.join(arm_names(s))}" for s in method_specs())
    verbs = (("train", "train a method with the shared trainer"), ("eval", "evaluate a method"))
    for verb, helptext in verbs:
        p = sub.add_parser(verb, help=helptext,
                           description=f"{helptext.capitalize()}. METHOD's experiment config "
                                       "(configs/experiment/METHOD.yaml) is composed with the Hydra "
                                       "overrides that follow, e.g. `debug=tiny trainer.max_steps=10`. "
                                       "Flags may stand anywhere among the overrides.",
                           epilog=f"Arms (--arm NAME), by method: {arms}.")
        p.add_argument("method", metavar="METHOD")
        p.add_argument("overrides", nargs="*", help="Hydra overrides (key=value, group=option)")
        p.add_argument("--arm", default=None, metavar="NAME",
                       help="run one arm of METHOD's experiments (a baseline or an ablation); the arms come "
                            "from the method (register_method(arms=...); `embodied methods` lists them), the "
                            "first is the method itself. The arm's overrides go before yours; its name is "
                            "recorded as the config's `arm`")
        p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
        if verb == "train":
            p.add_argument("--overwrite", action="store_true",
                           help="start over in out_dir even if it holds another run (the same config "
                                "resumes)")
        for flag in flags.values():
            if verb in flag.verbs:
                owners = [s.name for s in method_specs() if flag in s.flags]
                p.add_argument(flag.name, choices=flag.choices, default=None, dest=_flag_dest(flag.name),
                               help=f"{flag.help} (= {flag.override}=...; {', '.join(owners)})")
        p.set_defaults(func=_cmd_task, rest_dest="overrides", rest_needs="=")


def _flag_dest(name: str) -> str:
    return "flag_" + name.lstrip("-").replace("-", "_")


def _method_config(args):
    from core.config import compose
    from core.errors import ConfigError
    from core.registry import METHODS, load_plugins, method_specs

    load_plugins()
    if args.method not in METHODS:
        owners = [s.name for s in method_specs() if args.method in dict(s.arms)]
        if owners:  # e.g. eacwm, once a method of its own
            which = owners[0] if len(owners) == 1 else "METHOD"
            raise ConfigError(f"{args.method!r} is an arm of {', '.join(repr(o) for o in owners)}, not a "
                              f"method: `embodied {args.command} {which} --arm {args.method}`")
        known = ", ".join(METHODS.names()) or "none"
        raise ConfigError(f"unknown method {args.method!r} (registered: {known})")
    spec = METHODS.meta(args.method)["spec"]
    overrides = list(args.overrides)
    if any(o.lstrip("+~").partition("=")[0] == "arm" for o in overrides):
        raise ConfigError("choose an arm with --arm NAME (it applies the arm's overrides), not with arm=")
    for name, value in vars(args).items():
        if not name.startswith("flag_") or value is None:
            continue
        flag = next((f for f in spec.flags if _flag_dest(f.name) == name), None)
        if flag is None:
            owners = [s.name for s in method_specs() if any(_flag_dest(f.name) == name for f in s.flags)]
            raise ConfigError(f"--{name[5:].replace('_', '-')}: method {args.method!r} has no such option "
                              f"({', '.join(owners)} {'has' if len(owners) == 1 else 'have'})")
        overrides.append(f"{flag.override}={_override_value(value)}")
    cfg = compose([f"experiment={args.method}", *arm_overrides(spec, args.arm), *overrides])
    return METHODS.get(args.method), cfg


def _override_value(value: str) -> str:
    """A flag's value as a Hydra override value: quoted when it is not a plain token (``jpeg=75,blur=1``)."""
    import re

    if re.fullmatch(r"[\w.\-/:+]*", value):
        return value
    return "'" + value.replace("'", "\\'") + "'"


def arm_overrides(spec, arm: str | None) -> list[str]:
    """The overrides that ``--arm ARM`` puts before the user's: the arm's own, then ``arm=ARM`` (recorded).

    No ``--arm``: none. A method that declares no arms has one, named after it. An unknown name is a one-line
    ``ConfigError`` that lists the method's arms.
    """
    if arm is None:
        return []
    own = () if not spec.arms and arm == spec.name else spec.arm_overrides(arm)
    return [*own, f"arm={arm}"]


def _cmd_task(args) -> int:
    """`embodied train|eval METHOD`: compose the experiment config and call the method's task function."""
    module, cfg = _method_config(args)
    if args.print_config:
        from omegaconf import OmegaConf

        print(OmegaConf.to_yaml(cfg))
        return 0
    from core.bootstrap import prepare_process

    prepare_process()
    if args.command == "eval":
        return _run_eval(args, module, cfg)
    import contextlib

    from core.distributed import is_main_process
    from core.outputs import claim_output

    # Under torchrun rank 0 alone claims the folder (locks, marks it); the trainer writes from rank 0 only
    if is_main_process():
        claim = claim_output(cfg.out_dir, command=f"train {args.method}", staged=False,
                             signature=run_signature(cfg), overwrite=args.overwrite)
    else:
        claim = contextlib.nullcontext(Path(cfg.out_dir))
    with claim as out:
        done = _finished_checkpoint(out, cfg.trainer.max_steps)
        if done is not None:
            print(f"train {args.method}: already finished ({done.name}, "
                  f"trainer.max_steps={cfg.trainer.max_steps}); "
                  f"checkpoint: {done}. Raise trainer.max_steps to continue, or --overwrite to start over.")
            return 0
        result = module.train(cfg)
    print(f"trained {args.method}: {result}")
    return 0


def _run_eval(args, module, cfg) -> int:
    """Evaluate, then print the method's headline metrics as a table (the full JSON is where the method wrote it).

    A missing checkpoint in the run folder (no ``eval.checkpoint`` given) names the command that makes it.
    """
    import time

    from core.errors import CheckpointError, DataError
    from core.outputs import lock_folder, run_marker
    from core.registry import METHODS
    from embodied.results import eval_report, result_file

    start = time.time() - 1.0  # file times are coarse on some file systems
    out = Path(cfg.out_dir)
    if cfg.eval.checkpoint is None and not (out.is_dir() and any(out.iterdir())):  # before any data is made
        raise CheckpointError(f"{cfg.out_dir}: no such checkpoint; `{train_command(args)}` makes it, or set "
                              "eval.checkpoint=PATH")
    try:
        with lock_folder(cfg.out_dir):  # not while another process trains or evaluates in the folder
            result = module.evaluate(cfg)
    except (CheckpointError, DataError) as e:
        marker = run_marker(cfg.out_dir) or {}
        trained = str(marker.get("command", "")).startswith("train")
        if cfg.eval.checkpoint is None and marker.get("status") != "finished" and "embodied train" not in str(e):
            verb = f"resumes its training ({marker.get('status')})" if trained else "makes it"
            raise CheckpointError(f"{e}; `{train_command(args)}` {verb}, or set eval.checkpoint=PATH") from None
        raise
    spec = METHODS.meta(args.method)["spec"]
    print(eval_report(args.method, result, spec.headline, result_file(cfg.out_dir, start)))
    return 0


def train_command(args) -> str:
    """The ``embodied train`` command that makes the run ``embodied eval`` was given.

    The same arm, train flags and overrides; eval-only flags and the ``eval.*`` overrides are left out.
    """
    import shlex

    from core.registry import METHODS

    parts = ["embodied", "train", args.method, *(["--arm", args.arm] if args.arm else [])]
    for flag in METHODS.meta(args.method)["spec"].flags:  # an eval-only flag (SoLA's --rotate) is not repeated
        value = getattr(args, _flag_dest(flag.name), None)
        if value is not None and "train" in flag.verbs:
            parts += [flag.name, str(value)]
    parts += [o for o in args.overrides if not o.lstrip("+~").startswith("eval.")]
    return shlex.join(parts)


# Keys that may change between the runs of one training folder without making it another run.
_VOLATILE = {"out_dir": None, "arm": None, "eval": None,
             "trainer": ("max_steps", "progress", "tensorboard", "log_every", "ckpt_every", "keep_last",
                         "resume", "num_workers")}


def run_signature(cfg) -> dict:
    """What makes a training folder "the same run": the resolved config without output / schedule keys.

    The recorded ``arm`` name is left out too: ``--arm lora`` and the overrides it stands for are one run.
    """
    from core.config import to_container

    sig = to_container(cfg)
    for key, sub in _VOLATILE.items():
        if sub is None:
            sig.pop(key, None)
        elif isinstance(sig.get(key), dict):
            for k in sub:
                sig[key].pop(k, None)
    return sig


def _finished_checkpoint(out, max_steps: int):
    """The run's newest checkpoint when it already reached ``max_steps`` (single-stage trainers), or None."""
    from core.checkpoint import latest_checkpoint

    latest = latest_checkpoint(Path(out) / "checkpoints")
    if latest is None or not latest.name.startswith("step_"):
        return None
    return latest if int(latest.name.split("_")[1]) >= max_steps else None


def _add_experiment(sub) -> None:
    from core.registry import method_specs

    names = [s.name for s in method_specs() if s.experiment]
    p = sub.add_parser("experiment", help="run a method's paper comparison (arms x seeds, through train / eval)",
                       description="Run METHOD's paper-comparison study: every arm on every seed through "
                                   "`embodied train` / `embodied eval`, same data, budget and harness, then the "
                                   "table (summary.md / summary.json under --out). Finished runs are not run "
                                   "again; a killed one resumes. `embodied experiment METHOD --help` lists the "
                                   "study's options.",
                       epilog=f"Methods with a study: {', '.join(names)}.")
    p.add_argument("method", metavar="METHOD", choices=names)
    p.add_argument("args", nargs=argparse.REMAINDER, help="the study's options (see METHOD --help)")
    p.set_defaults(func=_cmd_experiment)


def _cmd_experiment(args) -> int:
    from core.experiments import run_experiment
    from core.registry import METHODS

    return run_experiment(args.method, METHODS.meta(args.method)["spec"].experiment, args.args)


def _add_methods(sub) -> None:
    p = sub.add_parser("methods", help="list the registered methods, their folders and their arms",
                       description="Every method that registered itself (entry points `embodied.methods`): "
                                   "name, folder, description, and the arms that `embodied train|eval "
                                   "METHOD --arm NAME` accepts (the first is the method itself).")
    p.set_defaults(func=_cmd_methods)


def _cmd_methods(args) -> int:
    from embodied.methods import status

    rows = status()
    w = max((len(r["name"]) for r in [{"name": "method"}, *rows]), default=0)
    print(f"{'method':<{w}}  {'folder':<22}  description (then its arms: `--arm NAME`, the first is the method)")
    for r in rows:
        print(f"{r['name']:<{w}}  {r['folder']:<22}  {r['description']}")
        print(f"{'':<{w}}  arms: {r['arms']}")
    return 0


def _add_models(sub) -> None:
    p = sub.add_parser("models", help="list the shipped checkpoints and the model folders under FOLDER",
                       description="The shipped checkpoints (assets/checkpoints) and every model folder found "
                                   "under each FOLDER (exports, training checkpoints, run directories: their "
                                   "latest checkpoint), with their model cards' fields: method, parameters, "
                                   "training domain, data, metrics, base, and the sub-folders the upstream "
                                   "libraries open. Reads cards, configs and weight headers only; writes nothing. "
                                   "Exit 1 when a folder's card or config is unreadable (the others are listed).")
    p.add_argument("folders", nargs="*", metavar="FOLDER", help="folders to search for model folders")
    p.add_argument("--json", action="store_true", help="print the rows as JSON (every card field, unshortened)")
    p.add_argument("--no-shipped", action="store_true", help="leave out the shipped checkpoints")
    p.set_defaults(func=_cmd_models, rest_dest="folders")


def _cmd_models(args) -> int:
    from embodied.models import run

    return run(args)


def _int_at_least(minimum: int):
    """An argparse ``type`` for an integer >= ``minimum`` (a one-line error otherwise)."""
    want = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {want}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {want}, got {value}")
        return value

    return parse


_non_negative_int, _positive_int = _int_at_least(0), _int_at_least(1)


class _Parser(argparse.ArgumentParser):
    """argparse with one-line usage errors (``embodied sim rollout: error: ... (see --help)``), exit 2."""

    def error(self, message: str):
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    """The whole command line; the registered methods supply the infer commands and train / eval flags."""
    from core.registry import load_plugins

    load_plugins()
    parser = _Parser(
        prog="embodied",
        description="Embodied-AI workspace: simulators, training, closed-loop evaluation and inference.",
        epilog=f"{EXIT_CODES} `embodied COMMAND --help` for more.",
    )
    parser.add_argument("--verbose", action="store_true",
                        help="keep third-party warnings and log lines (gym's banner, robosuite's INFO / WARNING "
                             "lines, highway-env's route warnings), filtered by default; accepted anywhere")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_demo(sub)
    _add_infer(sub)
    _add_sim(sub)
    _add_drive(sub)
    _add_libero(sub)
    _add_serve(sub)
    _add_train_eval(sub)
    _add_experiment(sub)
    _add_methods(sub)
    _add_models(sub)
    _add_exit_codes(parser)
    return parser


EXIT_CODES = "Exit codes: 0 ok, 1 some inputs of a batch failed (the rest written), 2 bad input, 130 interrupted."


def _add_exit_codes(parser: argparse.ArgumentParser) -> None:
    """End every sub-command's ``--help`` with the exit codes (after its own epilog, if any)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):  # aliases map to the same parser
                if EXIT_CODES not in (child.epilog or ""):
                    child.epilog = f"{child.epilog} {EXIT_CODES}" if child.epilog else EXIT_CODES
                _add_exit_codes(child)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``embodied`` console script; returns the exit code."""
    from core.bootstrap import set_headless_env

    set_headless_env()
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--verbose" not in argv:  # before anything imports the libraries (robosuite logs while importing)
        from core.logging import quiet_third_party

        quiet_third_party()
    try:
        parser = build_parser()
    except EmbodiedError as e:  # a broken method registration
        print(f"embodied: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    args, extra = parser.parse_known_args(argv)
    extra = [x for x in extra if x != "--verbose"]  # global, accepted after the command too
    if extra:
        # Flags may stand anywhere: after `eval sola --rotate so3 debug=tiny` or `infer normals a.png --out o
        # b.png`, argparse has closed the command's positional list at the flag; the leftovers join it.
        dest, needs = getattr(args, "rest_dest", None), getattr(args, "rest_needs", "")
        if dest and all(not x.startswith("-") and needs in x for x in extra):
            setattr(args, dest, [*(getattr(args, dest) or []), *extra])
        else:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        code = args.func(args)
    except EmbodiedError as e:
        print(f"embodied: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("embodied: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into `head` and the like
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
