"""The Hugging Face format: export a checkpoint as a LlamaForCausalLM directory, import one back.

    export_hf(run, out_dir, force=False) -> ExportResult   (safetensors + JSON; never imports torch)
    import_hf(hf_dir, out_dir, force=False) -> ImportResult

Modules: layout.py (names, layouts, config.json), tokenizer_json.py (tokenizer.json and the byte
alphabet), tensors.py (reading safetensors of any float dtype), export.py, importer.py, readme.py.
"""
from .export import ExportResult, export_hf
from .importer import ImportResult, import_hf

__all__ = ["export_hf", "import_hf", "ExportResult", "ImportResult"]
