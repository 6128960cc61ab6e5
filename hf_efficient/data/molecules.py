"""Molecules as graph records: RDKit atoms and bonds -> OGB-style node_feat, edge_index, edge_attr.

Atom features are OGB's nine integer categories (``ogb.utils.features``); bonds are one-hot type plus
conjugated / in-ring flags, each bond stored in both directions. RDKit is imported only when parsing SMILES.
"""

from __future__ import annotations

from typing import Any

from ..errors import InputError

# OGB's atom features (ogb.utils.features), as integer categories; the last value of each list is "other".
ATOM_FEATURES = {
    "atomic_num": list(range(1, 119)) + ["misc"],
    "chirality": ["CHI_UNSPECIFIED", "CHI_TETRAHEDRAL_CW", "CHI_TETRAHEDRAL_CCW", "CHI_OTHER", "misc"],
    "degree": list(range(11)) + ["misc"],
    "formal_charge": list(range(-5, 6)) + ["misc"],
    "num_hs": list(range(9)) + ["misc"],
    "num_radical_electrons": list(range(5)) + ["misc"],
    "hybridization": ["SP", "SP2", "SP3", "SP3D", "SP3D2", "misc"],
    "is_aromatic": [False, True],
    "is_in_ring": [False, True],
}
ATOM_VOCAB_SIZE = max(len(values) for values in ATOM_FEATURES.values())  # node_vocab_size: 119
BOND_TYPES = ["SINGLE", "DOUBLE", "TRIPLE", "AROMATIC"]
# edge_attr columns: one-hot bond type (other types: all four 0), conjugated, in a ring.
BOND_FEATURES = [*(f"bond_{name.lower()}" for name in BOND_TYPES), "is_conjugated", "is_in_ring"]


def _category(values: list, value) -> int:
    return values.index(value) if value in values else len(values) - 1


def mol_to_record(mol) -> dict[str, Any]:
    """An RDKit molecule (hydrogens implicit) -> ``node_feat`` [N][9] categories (:data:`ATOM_FEATURES`),
    ``edge_index`` [2][2B] (bond b is edges 2b: u -> v and 2b + 1: v -> u, as OGB), ``edge_attr`` [2B][6]
    (:data:`BOND_FEATURES`), ``num_nodes``."""
    node_feat = []
    for atom in mol.GetAtoms():
        values = (
            atom.GetAtomicNum(),
            str(atom.GetChiralTag()),
            atom.GetTotalDegree(),
            atom.GetFormalCharge(),
            atom.GetTotalNumHs(),
            atom.GetNumRadicalElectrons(),
            str(atom.GetHybridization()),
            atom.GetIsAromatic(),
            atom.IsInRing(),
        )
        node_feat.append([_category(c, v) for c, v in zip(ATOM_FEATURES.values(), values, strict=True)])
    sources, targets, edge_attr = [], [], []
    for bond in mol.GetBonds():
        u, v = bond.GetBeginAtomIdx(), bond.GetEndAtomIdx()
        kind = str(bond.GetBondType())
        row = [float(kind == name) for name in BOND_TYPES]
        row += [float(bond.GetIsConjugated()), float(bond.IsInRing())]
        sources += [u, v]
        targets += [v, u]
        edge_attr += [row, row]
    return {
        "edge_index": [sources, targets],
        "node_feat": node_feat,
        "edge_attr": edge_attr,
        "num_nodes": mol.GetNumAtoms(),
    }


def smiles_to_record(smiles: str) -> dict[str, Any]:
    """A SMILES string -> a record (see :func:`mol_to_record`); ``ValueError`` if RDKit cannot parse it."""
    from rdkit import Chem

    mol = Chem.MolFromSmiles(smiles)
    if mol is None:
        raise InputError(f"RDKit could not parse the SMILES {smiles!r}.")
    return mol_to_record(mol)
