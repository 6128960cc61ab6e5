"""The mouse connectomes shipped in graspologic's data folder, as OGB-style graph-classification records.

32 whole-brain diffusion-MRI connectomes (Wang et al. 2020, NeuroImage 223: 117274), 8 mice (4 male, 4
female) of each of 4 strains: the task is the strain (:data:`GENOTYPES`) from the wiring. The folder
``graspologic/datasets/mice/`` holds:

- ``edgelists/sub-<id>_ses-1_dti.edgelist``: one line ``u v count`` per connected pair of regions (each
  unordered pair once, no self loops; ``count`` = fibre tracts between the two regions, 1 to ~160,000),
  regions 0..331; every file names all 332 regions, about 36,000 pairs (65% of all pairs);
- ``participants.csv``: ``participant_id`` (``sub-<id>``), ``genotype``, ``sex``;
- ``atlas.csv``: the 166 regions of one hemisphere of the symmetric Waxholm atlas (``ROI`` 1..166,
  ``Structure``, ``Macrostructure``...);
- ``blocks.csv``: the 14 superstructures (7 per hemisphere) as ``block, hemisphere, i, j``: regions
  ``[i, j)``. Regions 0..165 are the left hemisphere, 166..331 the right one, both in atlas order, so region
  ``r`` is atlas row ``r % 166`` in hemisphere ``r // 166`` (:func:`region_features` checks this against
  the atlas' ``Macrostructure``);
- ``features/`` (per-subject region volumes and diffusion statistics): not used.

Records: ``edge_index`` both directions (as OGB), ``edge_attr`` = [log1p(count)] (one float per edge: the
counts span five orders of magnitude), ``num_nodes`` 332, ``y`` the genotype (``ClassLabel``), and
``subject`` / ``sex``. ``node_feat`` holds 4 integer categories per region (embedded per column and summed by
the model, ``node_vocab_size``): the region id (0..331: every graph has the same regions, so this gives
each region its own embedding, as one-hot node ids do for ``karate``), the atlas structure (0..165, shared by
the left and right copy of a region), the superstructure block (0..6, :data:`BLOCKS`) and the hemisphere
(0 left, 1 right). The last three add no information to the id but let homologous and neighbouring regions
share parameters, which matters with 24 training graphs. The strain signal is in the edges.

32 graphs only, so one fixed stratified split: 24 train / 8 test (2 per strain), scikit-learn's
``train_test_split(stratify=genotype, random_state=42)`` over the subjects in ``participants.csv`` order.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

GENOTYPES = ["B6", "BTBR", "CAST", "DBA2"]  # C57BL/6J, BTBR T+ Itpr3tf/J, CAST/EiJ, DBA/2J
BLOCKS = ["isocortex", "pallium", "subpallium", "diencephalon", "midbrain", "hindbrain", "white_matter"]
HEMISPHERES = ["L", "R"]
NUM_REGIONS = 332
CONNECTOME_TEST_SIZE = 8
NODE_FEATURES = ("region", "structure", "block", "hemisphere")  # the columns of node_feat


def _csv(files: dict[str, bytes], name: str):
    import pandas as pd

    if name not in files:
        raise FileNotFoundError(f"graspologic's mice folder has no {name}; its files: {sorted(files)[:8]}...")
    return pd.read_csv(io.BytesIO(files[name]))


def region_features(files: dict[str, bytes]) -> np.ndarray:
    """(332, 4) int64 ``node_feat`` rows: region id, atlas structure, block, hemisphere
    (:data:`NODE_FEATURES`), from ``atlas.csv`` and ``blocks.csv``."""
    atlas, blocks = _csv(files, "atlas.csv"), _csv(files, "blocks.csv")
    per_side = len(atlas)
    if 2 * per_side != NUM_REGIONS:
        raise ValueError(f"atlas.csv has {per_side} regions per hemisphere, expected {NUM_REGIONS // 2}.")
    features = np.full((NUM_REGIONS, len(NODE_FEATURES)), -1, dtype=np.int64)
    features[:, 0] = np.arange(NUM_REGIONS)
    features[:, 1] = features[:, 0] % per_side
    for row in blocks.itertuples():
        features[row.i : row.j, 2] = BLOCKS.index(row.block)
        features[row.i : row.j, 3] = HEMISPHERES.index(row.hemisphere)
    if (features < 0).any():
        raise ValueError("blocks.csv leaves some regions without a block.")
    macro = atlas["Macrostructure"].to_numpy()[features[:, 1]]
    if not (macro == np.array(BLOCKS)[features[:, 2]]).all():
        raise ValueError("blocks.csv and atlas.csv disagree: regions are not in atlas order per hemisphere.")
    if not (features[:, 3] == features[:, 0] // per_side).all():
        raise ValueError("blocks.csv does not put the left hemisphere first.")
    return features


def read_edgelist(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """``u v count`` lines -> (2, E) directed edges (each pair both ways) and (E, 1) float32 log1p(count)."""
    table = np.loadtxt(io.BytesIO(data), ndmin=2)  # (P, 3)
    pairs, counts = table[:, :2].astype(np.int64), table[:, 2]
    if pairs.size and (pairs.min() < 0 or pairs.max() >= NUM_REGIONS):
        raise ValueError(f"region ids outside [0, {NUM_REGIONS}) in an edgelist.")
    if (pairs[:, 0] == pairs[:, 1]).any() or (counts <= 0).any():
        raise ValueError("an edgelist has a self loop or a count <= 0.")
    if len(np.unique(np.sort(pairs, axis=1), axis=0)) != len(pairs):
        raise ValueError("an edgelist names a pair of regions twice.")
    edge_index = np.concatenate([pairs.T, pairs.T[::-1]], axis=1)  # (2, 2P): both directions, as OGB
    weight = np.log1p(counts).astype(np.float32)
    return edge_index, np.concatenate([weight, weight])[:, None]


def connectome_records(files: dict[str, bytes]) -> list[dict[str, Any]]:
    """One record per subject of ``participants.csv`` (in its order) from the files of graspologic's
    ``datasets/mice/`` folder (keyed by path below it, e.g. ``edgelists/sub-54776_ses-1_dti.edgelist``)."""
    participants = _csv(files, "participants.csv")
    node_feat = region_features(files).tolist()
    edgelists = {name.split("/")[-1].split("_")[0]: name for name in files if name.endswith(".edgelist")}
    records = []
    for row in participants.itertuples():
        if row.genotype not in GENOTYPES:
            raise ValueError(
                f"{row.participant_id}: unknown genotype {row.genotype!r}, expected {GENOTYPES}."
            )
        if row.participant_id not in edgelists:
            raise FileNotFoundError(
                f"no edgelists/{row.participant_id}_*.edgelist in graspologic's mice folder."
            )
        edge_index, edge_attr = read_edgelist(files[edgelists[row.participant_id]])
        records.append(
            {"edge_index": edge_index.tolist(), "node_feat": node_feat, "edge_attr": edge_attr.tolist()}
            | {"num_nodes": NUM_REGIONS, "y": GENOTYPES.index(row.genotype)}
            | {"subject": row.participant_id, "sex": row.sex}
        )
    return records


def stratified_split(labels: list[int], test_size: int, seed: int) -> tuple[list[int], list[int]]:
    """Sorted train / test record indices, ``test_size`` records stratified by label."""
    from sklearn.model_selection import train_test_split

    train, test = train_test_split(
        np.arange(len(labels)), test_size=test_size, stratify=labels, random_state=seed
    )
    return sorted(train.tolist()), sorted(test.tolist())
