"""Export a saved model folder for serving: a ``torch.export`` program and an ONNX file for ONNX Runtime.

    python scripts/export.py --model_name_or_path runs/rotten_tomatoes --output_dir runs/serving
    python scripts/export.py --model_name_or_path runs/rotten_tomatoes --output_dir runs/serving --no_onnx

Writes ``model.pt2``, ``model.onnx``, the config, the tokenizer or image processor, and ``export.json`` (the
inputs in order with their dynamic dimensions, the outputs, and how far the reloaded program and ONNX
Runtime are from the model on two input sizes the export did not see; over the tolerance it fails). Says each
step as it starts, on stderr (an export takes seconds to minutes). Runs the model with
``scripts/serve_onnx.py``. What exports and what is baked in: docs/serving.md. Needs the
``export`` extra (``pip install -e ".[export]"``) for the ONNX file.
"""

from __future__ import annotations

import argparse
import sys

from hf_efficient.cli import run_script
from hf_efficient.data.inputs import check_saved_tokenizer
from hf_efficient.export import ExportReport, export_folder
from hf_efficient.modeling.checkpoint_files import check_pretrained_path


def main(args: list[str] | None = None) -> ExportReport:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model_name_or_path", required=True, help="a folder saved by save_pretrained")
    parser.add_argument("--output_dir", required=True, help="the serving folder to write")
    parser.add_argument("--no_onnx", action="store_true", help="write the torch.export program only")
    parser.add_argument("--no_verify", action="store_true", help="skip the comparison with the model")
    parser.add_argument(
        "--no_optimize", action="store_true", help="skip the ONNX graph optimisation (faster export)"
    )
    parsed = parser.parse_args(args)
    local = check_pretrained_path(
        parsed.model_name_or_path, "--model_name_or_path", holds="config.json"
    )  # before the progress lines
    if local is not None:  # the tokenizer the serving folder will carry, if the model has one
        check_saved_tokenizer(parsed.model_name_or_path, "--model_name_or_path")
    report = export_folder(
        parsed.model_name_or_path,
        parsed.output_dir,
        onnx=not parsed.no_onnx,
        verify=not parsed.no_verify,
        optimize=not parsed.no_optimize,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )
    print(f"exported {report.architecture} ({', '.join(report.attention_types)}) to {report.output_dir}")
    for spec in report.inputs:
        print(f"  input  {spec['name']}: {spec['dtype']} {spec['shape']}")
    print(f"  output {', '.join(report.outputs)}; dimensions {report.dimensions}")
    for label, error in (("program", report.program_error), ("ONNX Runtime", report.onnx_error)):
        if error is not None:
            print(f"  {label}: largest difference from the model {error:.2e}")
    return report


if __name__ == "__main__":
    run_script(main)  # a user error: one "error: ..." line, exit status 2
