"""What a checkpoint really is: its config's layer layout, cross-checked against the tensor names of its
safetensors headers, against the code that reads its fields, and against the config the target vLLM
constructs from it.

Modules:

- `raw_config`: reading `config.json`: the file, the counts it declares, its submodels.
- `layer_ids`: layer ids in tensor and module names, and their short rendering.
- `id_lists`: layer-indexed arrays and layer-id lists, and what their values say about an id list's base.
- `kinds`: the per-layer kinds (dense/MoE, attention, routing, sharing) and the rules behind them.
- `quantization`: the quantization keys and the ignore list summarised per layer, part and module.
- `layout`: the whole raw layout of a config (`analyse`), built from the modules above.
- `findings`: the one finding type (severity, code, message) every check reports.
- `safetensors_headers`: the index and shard headers, read and checked without tensor data.
- `cross_check`: the layout against the tensor names (layer ids, MTP naming, kinds, ignore lists).
- `consumers`: the code that reads a config field, and the base a membership test proves.
- `id_bases`: id-list bases decided from tensors, then code; kinds rebuilt once decided.
- `construct`: the config built in the target interpreter, and its differences from the file.
- `evidence`: the checkpoint read, the environment record and interpreter, the source trees searched;
  `checkpoint_evidence`, what plan_trim and trim_model build on.
- `inspection`: inspect_config's workflow, from the model directory to findings and gaps.

Serves inspect_config, plan_trim and trim_model (through core/trim). Depends on foundation, sources and
target.
"""
