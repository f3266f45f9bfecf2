"""Convert a GGUF file into a safetensors model folder a CPU engine serves (run with an engine's Python).

Usage: ``python _real_model_converter.py MODEL.gguf OUT_DIR``. transformers'
GGUF loader (it needs the ``gguf`` package) dequantizes every tensor into a
float32 model and reads the tokenizer and chat template from the GGUF's
metadata; both are saved as a plain folder (``config.json``,
``model.safetensors``, ``tokenizer.json``, ``tokenizer_config.json`` with the
chat template). The weights stay float32: the dequantized values are exact
there, and the CPU engines serve float32 (bfloat16 prefilled 4-6x slower on
the test machine).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def main() -> int:
    gguf_path, out = Path(sys.argv[1]), Path(sys.argv[2])
    # The engine's packages: not in longctx's own environment.
    import torch  # type: ignore[import-not-found]
    import transformers  # type: ignore[import-not-found]
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.monotonic()
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
    )
    # The loader leaves the GGUF quantization config on a model it has already made dense; transformers
    # 5.19's save_pretrained refuses to save a "quantized" model, and an engine would look for a GGUF.
    for holder in (model, model.config):
        for name in ("hf_quantizer", "quantization_config"):
            if getattr(holder, name, None) is not None:
                try:
                    delattr(holder, name)
                except AttributeError:
                    setattr(holder, name, None)
    if hasattr(model, "is_quantized"):
        model.is_quantized = False
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(out)
    config = json.loads((out / "config.json").read_text())
    config.pop("quantization_config", None)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    template = json.loads((out / "tokenizer_config.json").read_text()).get("chat_template")
    if not template and not (out / "chat_template.jinja").is_file():
        print("the GGUF carries no chat template", file=sys.stderr)
        return 3
    print(
        f"converted {gguf_path.name} with transformers {transformers.__version__}, torch {torch.__version__}"
        f" in {time.monotonic() - started:.0f} s: {config.get('model_type')}, "
        f"{sum(p.numel() for p in model.parameters()):,} parameters"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
