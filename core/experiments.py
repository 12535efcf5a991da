"""The arm x seed experiment grid of the methods' studies (``embodied experiment METHOD``).

A driver names its method, its arms and its seeds; :class:`Grid` turns them into :class:`Cell` s (one run
folder ``<root>/<arm>_s<seed>`` each) and runs every cell through the public CLI in its own process, one
thread each (``embodied train METHOD <arm overrides> trainer.seed=S out_dir=DIR`` then ``embodied eval``
with the same overrides), ``workers`` at a time. A cell whose result file (``eval.json``) exists is done
and not rerun; a killed cell runs again (the trainer resumes its own folder). A failing cell is reported
(its log says why) and the others still run. :func:`collect` reads the finished cells back, by arm and seed;
:func:`seed_stats`, :class:`Column` and :func:`arm_table` turn them into markdown rows of mean ± sd over
seeds; :func:`write_summary` writes ``summary.json`` / ``summary.md`` atomically; :func:`grid_arguments`
adds the options every driver shares (``--out --arms --seeds --workers --collect-only``).

A method's ``experiments`` module declares its studies as data, :class:`Experiment` (its options and the
function that runs it), and names them in ``register_method(experiment="module:ATTR")``; the app layer's
``embodied experiment METHOD [STUDY] ...`` builds the one parser (:func:`experiment_parser`) and runs it
(:func:`run_experiment`). A driver parses nothing itself.

An arm's overrides come from the method's registry spec (``MethodSpec.arms``; :func:`method_arms`), the one
way a baseline or an ablation is chosen; a study whose arms are combinations of its own passes them itself.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.errors import ConfigError
from core.io import read_json, write_json, write_text

RUN_NAME = re.compile(r"(?P<arm>.+)_s(?P<seed>\d+)")  # a cell's folder: <arm>_s<seed>


def run_cli(args: list[str], log: str | Path, threads: int | None = 1) -> None:
    """Run ``embodied ARGS...`` in a child process, appending its output to ``log``.

    Args:
        args: the command line after ``embodied``.
        log: file the child's stdout and stderr are appended to (its folder is created).
        threads: intra-op threads of the child (``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS``); None inherits
            them.

    Raises:
        subprocess.CalledProcessError: the command failed (the log says why).
    """
    env = dict(os.environ)
    if threads is not None:
        env |= {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    log = Path(log)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as f:
        subprocess.run([sys.executable, "-m", "embodied.cli", *args], check=True, env=env, stdout=f,
                       stderr=subprocess.STDOUT)


def mean_sd(values: Sequence[float]) -> dict[str, float]:
    """``{"mean", "sd"}`` of per-seed values (sample standard deviation; 0 for a single value)."""
    return {"mean": statistics.fmean(values), "sd": statistics.stdev(values) if len(values) > 1 else 0.0}


# ------------------------------------------------------------------------------------------------ arms
def method_arms(method: str,
                fallback: Mapping[str, Sequence[str]] | None = None) -> dict[str, tuple[str, ...]]:
    """The arms of a registered method: name -> the overrides that select it (the first: the method itself).

    Args:
        method: a registered method name (``core.registry.METHODS``).
        fallback: the arms to use while the method's spec declares none.

    Raises:
        ConfigError: the method is not registered, or it has no arms and no ``fallback`` is given.
    """
    from core.registry import METHODS, load_plugins

    load_plugins()
    if method not in METHODS:
        raise ConfigError(f"unknown method {method!r} (registered: {', '.join(METHODS.names())})")
    spec = METHODS.meta(method).get("spec")
    if spec is not None and getattr(spec, "arms", ()):
        return {name: tuple(spec.arm_overrides(name)) for name, _ in spec.arms}
    if not fallback:
        raise ConfigError(f"method {method!r} declares no arms (register_method(..., arms=...))")
    return {name: tuple(over) for name, over in fallback.items()}


# ------------------------------------------------------------------------------------------------ cells
@dataclass(frozen=True)
class Cell:
    """One (method, arm, seed) run of a grid: its folder, its overrides and how to tell it is done.

    Attributes:
        method: the registered method ``embodied train`` / ``eval`` run.
        arm: the arm's name (the folder's prefix).
        seed: ``trainer.seed``.
        run_dir: the run's ``out_dir``.
        overrides: everything both commands get (arm overrides, the grid's extras, seed, ``out_dir``).
        result: the file ``embodied eval`` writes; the cell is done when it exists (and ``trained`` holds).
        log: where both commands' output is appended.
        eval_overrides: extra overrides of the eval command only.
        train_flags: extra flags of the train command when the folder exists but training has not finished
            (``--overwrite`` for a method whose training does not resume).
        trained: whether training finished (None: not known; the train command then runs until the cell is
            done, and the CLI resumes or reports a finished run).
        threads: intra-op threads of each command (None inherits the environment's).
    """

    method: str
    arm: str
    seed: int
    run_dir: Path
    overrides: tuple[str, ...]
    result: Path
    log: Path
    eval_overrides: tuple[str, ...] = ()
    train_flags: tuple[str, ...] = ()
    trained: Callable[[Path], bool] | None = field(default=None, compare=False)
    threads: int | None = 1

    @property
    def name(self) -> str:
        """The run folder's name, ``<arm>_s<seed>`` unless the grid names it otherwise."""
        return self.run_dir.name

    def is_trained(self) -> bool:
        """Whether training finished (False when not known)."""
        return self.trained is not None and self.trained(self.run_dir)

    def done(self) -> bool:
        """Whether the cell's result exists (and, when the grid can tell, its training finished)."""
        return self.result.is_file() and (self.trained is None or self.is_trained())

    def run(self) -> bool:
        """Train (unless finished) and evaluate; returns False when the cell was already done."""
        if self.done():
            return False
        if not self.is_trained():
            self.result.unlink(missing_ok=True)  # from a shorter run: evaluate again after training
            flags = list(self.train_flags) if self.run_dir.exists() else []
            run_cli(["train", self.method, *self.overrides, *flags], self.log, self.threads)
        run_cli(["eval", self.method, *self.overrides, *self.eval_overrides], self.log, self.threads)
        return True


@dataclass(frozen=True)
class Failure:
    """A job of :func:`run_jobs` that raised: its name, the one-line reason, and the log that says more."""

    name: str
    reason: str
    log: Path | None = None

    def __str__(self) -> str:
        """``name: reason (log: path)``."""
        return f"{self.name}: {self.reason}" + (f" (log: {self.log})" if self.log else "")


def run_jobs(jobs: Sequence[tuple[str, Callable[[], Any]]], workers: int = 1, first_alone: bool = False,
             logs: Mapping[str, Path] | None = None) -> list[Failure]:
    """Run named jobs ``workers`` at a time; a job that raises is reported and the others still run.

    Args:
        jobs: ``(name, function)`` pairs; a function returning False means "already done" (not run).
        workers: jobs at a time (threads: each job waits on its own child process).
        first_alone: run the first job before the others start (it builds what they share: data, a base
            model); when it fails the rest are not run.
        logs: name -> log file, named in the failure report.

    Returns:
        The failures, in job order (empty when every job succeeded).
    """
    if workers < 1:
        raise ConfigError(f"workers must be >= 1, got {workers}")
    logs = logs or {}
    failures: dict[int, Failure] = {}
    lock = threading.Lock()
    finished = [0]

    def one(i: int) -> None:
        name, fn = jobs[i]
        t0 = time.monotonic()
        try:
            ran = fn()
            status = "done" if ran is not False else "skipped (done before)"
        except Exception as e:  # noqa: BLE001 - reported with the others; the log says more
            reason = f"exit {e.returncode}" if isinstance(e, subprocess.CalledProcessError) else \
                (str(e).splitlines() or [type(e).__name__])[0]
            failures[i] = Failure(name, reason, logs.get(name))
            status = f"FAILED: {failures[i]}"
        with lock:
            finished[0] += 1
            print(f"[{finished[0]}/{len(jobs)}] {name} {status} ({time.monotonic() - t0:.0f} s)", flush=True)

    rest = range(len(jobs))
    if first_alone and jobs:
        one(0)
        rest = range(1, len(jobs))
        if 0 in failures:
            for i in rest:
                failures[i] = Failure(jobs[i][0], f"not run: {jobs[0][0]} (run first) failed")
            rest = range(0)
    if len(rest):
        with ThreadPoolExecutor(min(workers, len(rest))) as pool:
            list(pool.map(one, rest))
    return [failures[i] for i in sorted(failures)]


@dataclass
class Grid:
    """The arm x seed grid of one method: every cell through the public CLI, skip-if-done, a worker pool.

    Attributes:
        method: the registered method.
        root: the folder holding one run folder per cell.
        arms: arm name -> its overrides (:func:`method_arms`, or a study's own combinations), in run order.
        seeds: ``trainer.seed`` values.
        overrides: overrides of every cell (after the arm's, before the seed and ``out_dir``).
        result: the file of a run folder that marks a finished cell.
        eval_overrides: extra overrides of the eval command only.
        name: the run folder's name, formatted with ``arm`` and ``seed``.
        log_dir: the folder of the cells' logs (default: ``<run folder>.log`` beside each run folder).
        train_flags: see :class:`Cell`.
        trained: see :class:`Cell`.
        threads: intra-op threads of each command (None inherits the environment's).
    """

    method: str
    root: Path
    arms: Mapping[str, Sequence[str]]
    seeds: Sequence[int]
    overrides: Sequence[str] = ()
    result: str = "eval.json"
    eval_overrides: Sequence[str] = ()
    name: str = "{arm}_s{seed}"
    log_dir: Path | None = None
    train_flags: Sequence[str] = ()
    trained: Callable[[Path], bool] | None = None
    threads: int | None = 1

    def __post_init__(self) -> None:
        """Check that there is something to run."""
        self.root = Path(self.root)
        if not self.arms or not self.seeds:
            raise ConfigError(f"{self.method} grid: no {'arms' if not self.arms else 'seeds'} to run")

    def cells(self) -> list[Cell]:
        """Every (arm, seed) cell, arm-major in the order of ``arms`` and ``seeds``."""
        cells = []
        for arm, arm_over in self.arms.items():
            for seed in self.seeds:
                run_dir = self.root / self.name.format(arm=arm, seed=seed)
                log = (self.log_dir / f"{run_dir.name}.log") if self.log_dir else run_dir.with_suffix(".log")
                over = (*arm_over, *self.overrides, f"trainer.seed={seed}", f"out_dir={run_dir}")
                cells.append(Cell(self.method, arm, seed, run_dir, over, run_dir / self.result, log,
                                  tuple(self.eval_overrides), tuple(self.train_flags), self.trained,
                                  self.threads))
        return cells

    def run(self, workers: int = 1, first_alone: bool = False) -> list[Failure]:
        """Run the cells not yet done, ``workers`` at a time; returns the failures (see :func:`run_jobs`)."""
        cells = self.cells()
        logs = {c.name: c.log for c in cells}
        return run_jobs([(c.name, c.run) for c in cells], workers, first_alone, logs)

    def evaluate(self, variants: Mapping[str, Sequence[str]], workers: int = 1) -> list[Failure]:
        """Evaluate every finished cell again under each variant (e.g. a degradation of the test data).

        Args:
            variants: result file -> the eval overrides that write it (``{"eval_jpeg75.json":
                ["data.degrade='jpeg=75'"]}``); a cell whose file exists is not evaluated again.
            workers: cells at a time (a cell's variants run one after another: an evaluation locks the run
                folder).

        Returns:
            The failures (see :func:`run_jobs`); cells not done are left out.
        """
        jobs, logs = [], {}
        for c in self.cells():
            if not c.done():
                continue

            def one(c=c) -> bool:  # a cell's variants one after another: an evaluation locks its run folder
                todo = [(r, o) for r, o in variants.items() if not (c.run_dir / r).is_file()]
                for _, over in todo:
                    run_cli(["eval", c.method, *c.overrides, *c.eval_overrides, *over], c.log, c.threads)
                return bool(todo)
            name = f"{c.name} ({', '.join(Path(r).stem for r in variants)})"
            jobs.append((name, one))
            logs[name] = c.log
        return run_jobs(jobs, workers, logs=logs)

    def collect(self) -> dict[str, dict[int, Any]]:
        """The finished cells' results: arm -> seed -> the result JSON (arms and seeds in grid order)."""
        out: dict[str, dict[int, Any]] = {}
        for c in self.cells():
            if c.done():
                out.setdefault(c.arm, {})[c.seed] = read_json(c.result)
        return out


def collect(root: str | Path, result: str = "eval.json", arms: Iterable[str] | None = None,
            seeds: Iterable[int] | None = None) -> dict[str, dict[int, Any]]:
    """Every finished ``<root>/<arm>_s<seed>/<result>``: arm -> seed -> the result JSON.

    Args:
        root: the grid's folder.
        result: the result file of a run folder.
        arms: only these arms, in this order (default: every arm found, sorted).
        seeds: only these seeds (default: every seed found), ascending.
    """
    found: dict[str, dict[int, Path]] = {}
    for f in Path(root).glob(f"*/{result}"):
        m = RUN_NAME.fullmatch(f.parent.name)
        if m:
            found.setdefault(m["arm"], {})[int(m["seed"])] = f
    keep = None if seeds is None else set(seeds)
    names = sorted(found) if arms is None else [a for a in arms if a in found]
    out = {}
    for arm in names:
        by_seed = {s: read_json(f) for s, f in sorted(found[arm].items()) if keep is None or s in keep}
        if by_seed:
            out[arm] = by_seed
    return out


# ------------------------------------------------------------------------------------------------ tables
def lookup(result: Mapping[str, Any], path: str | Callable[[Mapping[str, Any]], Any]) -> Any:
    """The value at ``path`` (keys joined by ``/``, e.g. ``"per_generator/mean/acc"``) or ``path(result)``.

    Raises:
        KeyError: a key of ``path`` is missing.
    """
    if callable(path):
        return path(result)
    value: Any = result
    for key in path.split("/"):
        value = value[key]
    return value


def seed_stats(results: Iterable[Mapping[str, Any]], metrics: Mapping[str, str | Callable]) -> dict[str, Any]:
    """Mean and sd over seeds of each metric: ``{"seeds": n, name: {"mean", "sd"}, ...}``.

    Args:
        results: one result JSON per seed.
        metrics: name -> path in a result (see :func:`lookup`); a metric missing from any seed's result is
            left out of the row.
    """
    results = list(results)
    row: dict[str, Any] = {"seeds": len(results)}
    for name, path in metrics.items():
        try:
            values = [float(lookup(r, path)) for r in results]
        except (KeyError, TypeError):
            continue
        if values:
            row[name] = mean_sd(values)
    return row


def pm(value: Any, scale: float = 1.0, digits: int = 2, zero_sd: bool = True) -> str:
    """A table cell: ``{"mean", "sd"}`` as ``mean ± sd`` (times ``scale``), a number, or ``-`` for None.

    ``zero_sd=False`` leaves out a zero spread (a single seed).
    """
    if value is None:
        return "-"
    if isinstance(value, Mapping) and "mean" in value:
        text = f"{scale * value['mean']:.{digits}f}"
        sd = value.get("sd", 0.0)
        return text if not sd and not zero_sd else f"{text} ± {scale * sd:.{digits}f}"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    return f"{scale * value:.{digits}f}" if isinstance(value, float) or scale != 1.0 else str(value)


@dataclass(frozen=True)
class Column:
    """A column of :func:`arm_table`: its header and the row keys its cell shows.

    Attributes:
        header: the column's header.
        keys: row key(s); several are formatted each with :func:`pm` and joined by ``template``.
        scale: multiplies means and sds (100 for a fraction shown in %).
        digits: decimals.
        template: how the formatted values are put together (default: joined by `` / ``).
        missing: the cell when a key is missing from the row.
    """

    header: str
    keys: str | tuple[str, ...]
    scale: float = 1.0
    digits: int = 2
    template: str | None = None
    missing: str = "-"

    def cell(self, row: Mapping[str, Any], zero_sd: bool = True) -> str:
        """The formatted cell of ``row``."""
        keys = (self.keys,) if isinstance(self.keys, str) else self.keys
        if any(k not in row for k in keys):
            return self.missing
        parts = [pm(row[k], self.scale, self.digits, zero_sd) for k in keys]
        return self.template.format(*parts) if self.template else " / ".join(parts)


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A markdown table (no trailing newline)."""
    lines = ["| " + " | ".join(map(str, header)) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(map(str, r)) + " |" for r in rows]
    return "\n".join(lines)


def arm_table(rows: Mapping[str, Mapping[str, Any]], columns: Sequence[Column], label: str = "arm",
              labels: Mapping[str, str] | None = None, zero_sd: bool = True) -> str:
    """One markdown row per arm (``rows``: arm -> :func:`seed_stats` row), one column per :class:`Column`."""
    labels = labels or {}
    body = ([labels.get(arm, arm), *(c.cell(r, zero_sd) for c in columns)] for arm, r in rows.items())
    return markdown_table([label, *(c.header for c in columns)], body)


def write_summary(out: str | Path, summary: Any, markdown: str, name: str = "summary") -> str:
    """Write ``<out>/<name>.json`` and ``<out>/<name>.md`` atomically; returns the markdown (line-ended)."""
    markdown = markdown if markdown.endswith("\n") else markdown + "\n"
    write_json(Path(out) / f"{name}.json", summary)
    write_text(Path(out) / f"{name}.md", markdown)
    return markdown


# -------------------------------------------------------------------------------------------- command line
@dataclass(frozen=True)
class Experiment:
    """One study of a method as ``embodied experiment METHOD [STUDY]`` runs it.

    ``run(args)`` gets the parsed options (plus ``args.command_line``, the command as typed, for summaries)
    and returns the exit status, or its summary (exit 1 if it lists ``failed`` runs). ``out`` makes it a
    grid: the shared ``--out --seeds --workers --collect-only`` options (and ``--arms`` when ``arms`` is
    given: the default arms, checked later against the method's) come from :func:`grid_arguments`;
    ``options`` are the study's own, as ``(flag, argparse keywords)`` pairs.
    """

    run: Callable[[argparse.Namespace], int | Mapping[str, Any] | None]
    help: str = ""
    out: str | None = None
    arms: Sequence[str] | None = None
    seeds: Sequence[int] = (0, 1)
    workers: int = 2
    options: Sequence[tuple[str | tuple[str, ...], Mapping[str, Any]]] = ()

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        """Add this study's options to ``parser`` and make it the one ``run_experiment`` calls."""
        if self.out is not None:
            grid_arguments(parser, out=self.out, default_arms=self.arms, seeds=self.seeds, workers=self.workers)
        for flags, kwargs in self.options:
            parser.add_argument(*((flags,) if isinstance(flags, str) else flags), **dict(kwargs))
        parser.set_defaults(_experiment=self)


def experiment_parser(method: str, studies: Experiment | Mapping[str, Experiment],
                      description: str = "") -> argparse.ArgumentParser:
    """The parser of ``embodied experiment METHOD``: one study's options, or one sub-command per study."""
    parser = argparse.ArgumentParser(prog=f"embodied experiment {method}", description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    if isinstance(studies, Experiment):
        studies.add_to(parser)
        return parser
    sub = parser.add_subparsers(dest="study", metavar="STUDY", required=True)
    for name, study in studies.items():
        study.add_to(sub.add_parser(name, help=study.help, description=study.help))
    return parser


def run_experiment(method: str, target: str, argv: Sequence[str]) -> int:
    """Run ``embodied experiment METHOD ARGV``: the studies at ``target`` ("module:ATTR"), parsed and run."""
    import shlex

    from core.registry import import_target

    module_name = target.partition(":")[0]
    studies = import_target(target)
    doc = (sys.modules[module_name].__doc__ or "").strip()
    parser = experiment_parser(method, studies, doc)
    args, extra = parser.parse_known_args(list(argv))
    if extra:  # config overrides may stand after the flags, as in `embodied train`
        if hasattr(args, "overrides") and all(not x.startswith("-") and "=" in x for x in extra):
            args.overrides = [*(args.overrides or []), *extra]
        else:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.command_line = shlex.join(["embodied", "experiment", method, *argv])
    result = args._experiment.run(args)
    if isinstance(result, Mapping):  # a study that returns its summary: failed runs are listed under "failed"
        return 1 if result.get("failed") else 0
    return int(result or 0)


def moved(module: str, method: str) -> int:
    """What ``python -m <module>`` (a driver's old spelling) does now: say where the command went; exit 2."""
    print(f"`python -m {module}` moved: run `embodied experiment {method} ...` with the same arguments "
          f"(`embodied experiment {method} --help` lists them)", file=sys.stderr)
    return 2


def grid_arguments(parser: argparse.ArgumentParser, *, out: str, arms: Sequence[str] | None = None,
                   default_arms: Sequence[str] | None = None, seeds: Sequence[int] = (0, 1),
                   workers: int = 2) -> argparse.ArgumentParser:
    """Add the grid options every driver shares: ``--out --arms --seeds --workers --collect-only``.

    ``--jobs`` and ``--summary-only`` are kept as other names of ``--workers`` and ``--collect-only``.
    ``arms`` None leaves ``--arms`` free (checked later, against the method's arms).
    """
    parser.add_argument("--out", type=Path, default=Path(out), help=f"the grid's folder (default {out})")
    if arms is not None or default_arms is not None:
        parser.add_argument("--arms", nargs="+", default=list(default_arms or arms or ()),
                            choices=list(arms) if arms is not None else None,
                            help="arms to run (default: %(default)s)")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(seeds), help="trainer.seed values")
    parser.add_argument("--workers", "--jobs", dest="workers", type=int, default=workers,
                        help="runs at a time, each its own process with one thread (default %(default)s)")
    parser.add_argument("--collect-only", "--summary-only", dest="collect_only", action="store_true",
                        help="run nothing: only tabulate the finished runs")
    return parser


def pick_arms(available: Mapping[str, Sequence[str]], names: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """``available`` restricted to ``names`` (in their order); an unknown name is a ``ConfigError``."""
    bad = [n for n in names if n not in available]
    if bad:
        raise ConfigError(f"unknown arm(s) {', '.join(bad)} (arms: {', '.join(available)})")
    return {n: tuple(available[n]) for n in names}


def report(failures: Sequence[Failure]) -> int:
    """Print the failures (one line each, to stderr); the exit status of a driver: 1 if any failed, else 0."""
    for f in failures:
        print(f"failed: {f}", file=sys.stderr)
    return 1 if failures else 0
