"""Workspace bytes: what one step allocates beyond the weights and the state, by kernel path.

A stage runs its blocks one after another, so it needs the largest block's peak, not the sum, plus
what the stage itself holds for a step. Each kernel path states its own (``profile.kernel_path``):

* ``triton`` (accelerators): per block, the tensors live at the block's peak for the step's tokens
  (``BlockSpec.step_values_per_token`` in the activation dtype), plus the larger of the float32 values
  live inside the mixer (``step_f32_values_per_token``: the chunked delta rule's operands; attention
  runs in paged flash-style kernels, so no score matrix), decode attention's split partials for every
  decoding row (``decode_partial_values``: a fixed number of splits per row, whatever its length) and
  the dense tile a packed (non-Q8_0) matmul of 128 or more rows dequantizes (``DEVICE_TILE_ELEMENTS``
  values at most) with that tile's output, never live at once; with CUDA graphs (``profile.cuda_graphs``)
  the captures' temporaries stay in the graphs' pool while the mixers run eagerly beside it, so the pool's
  share (the values, a tile or the partials) and the mixer's (``mix_values_per_token``, the float32
  operands or the partials) add up; a decode's state entries take nothing (updated in place); per stage, cuBLAS's
  workspaces (:data:`CUBLAS_WORKSPACE_BYTES` per stream that multiplies), the outputs decode graphs
  keep (:func:`graph_output_bytes`), the buffers packed steps' graph pieces keep
  (:func:`packed_graph_bytes`) and the rest of the graphs' pool's first segment (:func:`graph_pool_top_up_bytes`);
* ``torch`` (CPUs): the reference layers' activations, router values and fp32 attention scores over
  the attended context (SDPA's math), the keys and values gathered from the paged pool, and
  ``TILE_ELEMENTS``-value dequantized tiles;
* ``mixed``: the larger of the two.

Every stage also holds the hidden state in and out (``2 x step tokens x hidden``); the exit stage the
logits of the rows that get them (one per sequence at most: the last token of a prompt's chunk or a
decode token), in the activation dtype then float32. A step carries at most ``Profile.step_tokens``
tokens (the prefill budget, or every sequence but one decoding beside a block of a prompt).
"""

from __future__ import annotations

from stagewise.errors import ConfigError
from stagewise.spec.block_spec import BlockSpec
from stagewise.spec.model_spec import ModelSpec
from stagewise.spec.packed_types import DEQUANT_MATMUL_MIN_ROWS, DEVICE_TILE_ELEMENTS, TILE_ELEMENTS
from stagewise.spec.profile import Profile
from stagewise.spec.quant_presets import preset

F32_BYTES = 4
HANDOFF_BUFFERS = 2  # hidden state in + hidden state out
# cuBLAS keeps one workspace per (handle, stream) that runs a GEMM, allocated through the caching
# allocator: 32 MiB on Hopper (PyTorch's default CUBLAS_WORKSPACE_CONFIG ":4096:8"); a stage multiplies
# on its compute stream and on its CUDA-graph capture stream
CUBLAS_WORKSPACE_BYTES = 32 << 20
CUBLAS_STREAMS = 2
# The caching allocator holds blocks of up to 1 MiB in 2 MiB segments, a CUDA graphs' private pool too: a pool
# takes at least one whole segment (measured on an H100: tiny models' graphs held 0.85 MB more than their tensors)
GRAPH_POOL_SEGMENT_BYTES = 2 << 20
TOKEN_BUCKET_ALIGN = 16  # packed steps' largest graph bucket: the most a step carries, rounded up to this


def _quantized(fmt: str) -> bool:
    try:
        return preset(fmt).quantized
    except ConfigError:  # a label of packed types the presets do not name (a GGUF file's): quantized
        return True


def tile_bytes(matrices: tuple[tuple[int, int], ...], fmt: str, tokens: int, profile: Profile, path: str) -> int:
    """The largest dense tile a packed matmul of ``tokens`` rows dequantizes for one of ``matrices``
    ``(out, in)``, plus that tile's output when the matrix takes more than one tile; none for a dense
    format, and none on the Triton path below 128 rows or for Q8_0 (dequantized in registers)."""
    if not matrices or not _quantized(fmt):
        return 0
    if path == "triton":
        if tokens < DEQUANT_MATMUL_MIN_ROWS or fmt == "q8_0":
            return 0
        cap = DEVICE_TILE_ELEMENTS
    else:
        cap = TILE_ELEMENTS
    worst = 0
    for out, inner in matrices:
        rows = min(out, max(1, cap // inner))
        temp = tokens * rows if rows < out else 0  # each tile's product, copied into the output
        worst = max(worst, (rows * inner + temp) * profile.activation_bytes)
    return worst


def block_workspace_bytes(block: BlockSpec, profile: Profile, fmt: str = "bf16") -> int:
    """Peak bytes block ``block`` allocates during one step of ``profile`` on its kernel path."""
    if profile.kernel_path == "mixed":
        return max(_block_bytes(block, profile, fmt, "triton"), _block_bytes(block, profile, fmt, "torch"))
    return _block_bytes(block, profile, fmt, profile.kernel_path)


def _block_bytes(block: BlockSpec, profile: Profile, fmt: str, path: str) -> int:
    tokens = profile.step_tokens
    if path == "triton":
        f32 = tokens * block.step_f32_values_per_token * F32_BYTES  # the mixer's scan operands, the routing
        partials = _partial_bytes(block, profile)
        # A decode's recurrent and conv state entries take nothing: its kernels update them in place
        # (deltanet_decode_triton.delta_step and conv_step read one entry of the pool and write another).
        if not profile.cuda_graphs:
            # the float32 operands live inside the mixer's scan, the dequantized tiles inside a matmul, the
            # partials between decode attention's two launches: never at once
            tile = tile_bytes(block.matrices, fmt, tokens, profile, path)
            return _step_value_bytes(block, profile) + max(f32, tile, partials)
        # Beside the graphs' pool (block_pool_bytes) the mixers run eagerly (runtime/packed_graphs.py): their
        # own temporaries, then the scan's float32 operands or, for decoding rows, the partials.
        pool = block_pool_bytes(block, profile, fmt)
        return pool + tokens * block.mix_values_per_token * profile.activation_bytes + max(f32, partials)
    # a torch decode of every row gathers each row's state entry and computes a new one before storing it
    # (models/layers/delta_rule.packed_recurrent_step)
    decode_state = profile.batch * 2 * (block.recurrent_state_values * F32_BYTES
                                        + block.conv_state_values * profile.activation_bytes)
    per_token = (
        max(block.activation_values_per_token, block.step_values_per_token) * profile.activation_bytes
        + (block.f32_values_per_token + block.step_f32_values_per_token) * F32_BYTES
        + block.score_values_per_position * profile.context_tokens * F32_BYTES
    )
    # the torch path attends over keys and values gathered from the pool: every row's attended context
    gathered = profile.batch * profile.context_tokens * block.kv_values_per_token * profile.activation_bytes
    return tokens * per_token + gathered + tile_bytes(block.matrices, fmt, tokens, profile, path) + decode_state


def _step_value_bytes(block: BlockSpec, profile: Profile) -> int:
    """Triton path: the block's tensors live at any moment of a step, at most, in the activation dtype."""
    return profile.step_tokens * block.step_values_per_token * profile.activation_bytes


def _partial_bytes(block: BlockSpec, profile: Profile) -> int:
    """Decode attention's split partials of every decoding row (kernels/decode_attention_triton.py)."""
    return profile.batch * block.decode_partial_values * F32_BYTES


def block_pool_bytes(block: BlockSpec, profile: Profile, fmt: str = "bf16") -> int:
    """What block ``block``'s captures keep in the stage's CUDA graphs' pool for good, one capture's at a time
    (graphs off the torch path; else none): a packed step's pieces (the block's values and a dequantized tile) or
    a decode graph's (its rows' values and decode attention's partials; rows <= tokens)."""
    if profile.kernel_path == "torch" or not profile.cuda_graphs:
        return 0
    tile = tile_bytes(block.matrices, fmt, profile.step_tokens, profile, "triton")
    return _step_value_bytes(block, profile) + max(tile, _partial_bytes(block, profile))


def graph_pool_top_up_bytes(spec: ModelSpec, profile: Profile) -> int:
    """Per stage with CUDA graphs: the rest of the pool's first segment where what the plan puts there (the least
    any block keeps, :func:`block_pool_bytes`, and a non-exit stage's decode graph outputs) is below one
    (:data:`GRAPH_POOL_SEGMENT_BYTES`): small models' pools. A bound for every stage of ``spec``, as the
    placement search sums it."""
    if profile.kernel_path == "torch" or not profile.cuda_graphs:
        return 0
    least = min((block_pool_bytes(b, profile, spec.format) for b in spec.blocks), default=0)
    return max(0, GRAPH_POOL_SEGMENT_BYTES - least - graph_output_bytes(spec, profile, False))


def handoff_buffer_bytes(hidden_size: int, profile: Profile) -> int:
    """Per stage: the hidden state in and out of a step."""
    return HANDOFF_BUFFERS * profile.step_tokens * hidden_size * profile.activation_bytes


def runtime_bytes(profile: Profile) -> int:
    """Per stage on the Triton path: cuBLAS's workspaces (none on the torch path)."""
    return CUBLAS_STREAMS * CUBLAS_WORKSPACE_BYTES if profile.kernel_path != "torch" else 0


def logit_rows(profile: Profile) -> int:
    """Rows a step computes logits for: one per sequence at most."""
    return profile.batch


def logits_buffer_bytes(vocab_size: int, profile: Profile, hidden_size: int = 0, fmt: str = "bf16") -> int:
    """Exit stage: the logits of :func:`logit_rows` rows, in the activation dtype then float32, and the
    LM head's dequantized tile when that many rows take one."""
    rows = logit_rows(profile)
    head = tile_bytes(((vocab_size, hidden_size),), fmt, rows, profile, "triton" if profile.kernel_path != "torch"
                      else "torch") if hidden_size else 0
    return rows * vocab_size * (profile.activation_bytes + F32_BYTES) + head


def batch_buckets(batch: int) -> list[int]:
    """Rows a decode graph of up to ``batch`` sequences runs, as one decode group launches them
    (engine/decode_groups.plan_groups, warm-up captures each): the bucket (1, 2, 4, 8, then multiples of 8)
    unless it would reach the last row while a row is free for the next sequence, then the exact count."""
    out = set()
    for n in range(1, batch + 1):
        bucket = 1 << (n - 1).bit_length() if n <= 8 else -(-n // 8) * 8
        limit = batch - 1 if n < batch else batch  # one row left for the next sequence to start in
        out.add(bucket if bucket <= limit else n)
    return sorted(out)


def graph_output_bytes(spec: ModelSpec, profile: Profile, exit: bool) -> int:
    """What decode graphs keep once captured (``runtime/step_graphs.py``; packed steps' graph pieces keep
    their buffers, :func:`packed_graph_bytes`): each graph's own outputs, one graph for each decode batch
    bucket (decode attention reads each row's length on the device: one graph serves every attended length). At the exit a graph
    keeps its rows' float32 logits and features, elsewhere the hidden state it hands on.

    NOTE: the reference path on a GPU (``STAGEWISE_KERNELS=torch``, for A/B runs and bisecting) keys its
    graphs by attended-length bucket too (``runtime/step_graphs.kv_bucket``), a graph per bucket up to
    the context: not charged here."""
    if profile.kernel_path == "torch" or not profile.cuda_graphs:
        return 0
    a = profile.activation_bytes
    per_row = spec.vocab_size * F32_BYTES + spec.hidden_size * a if exit else spec.hidden_size * a
    return sum(batch_buckets(profile.batch)) * per_row


def largest_token_bucket(step_tokens: int) -> int:
    """The largest token bucket packed steps are padded to (``runtime/packed_graphs.token_buckets``), what their
    graph pieces' buffers are sized for: ``step_tokens`` rounded up to :data:`TOKEN_BUCKET_ALIGN`."""
    return -(-max(step_tokens, 1) // TOKEN_BUCKET_ALIGN) * TOKEN_BUCKET_ALIGN


def packed_graph_bytes(spec: ModelSpec, profile: Profile) -> int:
    """The static buffers packed steps' graph pieces keep (``runtime/packed_graphs.py``), sized for the largest
    token bucket (:func:`largest_token_bucket`): the step's input and output, and what
    crosses a cut (``BlockSpec.cut_values_per_token``: the residual stream, the mixer's projections and
    output) for each kind of block the model has (blocks of one kind share their buffers), whichever the
    stage holds: one figure for every stage, as the placement search sums it. The pieces' temporaries
    live in the graphs' pool, charged per block beside the mixer's (:func:`block_workspace_bytes`)."""
    if profile.kernel_path == "torch" or not profile.cuda_graphs:
        return 0
    top = largest_token_bucket(profile.step_tokens)
    cuts = sum({block.mixer: block.cut_values_per_token for block in spec.blocks}.values())
    return top * (cuts + 2 * spec.hidden_size) * profile.activation_bytes


def stage_workspace_bytes(spec: ModelSpec, profile: Profile, blocks: list[BlockSpec], entry: bool, exit: bool) -> int:
    """Workspace of a stage holding ``blocks`` (+ entry / exit): the largest block's step, the handoff
    buffers, the runtime's workspace, the CUDA graphs' outputs and buffers and (exit) the logits."""
    step = max((block_workspace_bytes(b, profile, spec.format) for b in blocks), default=0)
    if entry and not blocks:
        step = profile.step_tokens * spec.hidden_size * (profile.activation_bytes + F32_BYTES)  # rows embedded
    total = step + handoff_buffer_bytes(spec.hidden_size, profile) + runtime_bytes(profile)
    total += graph_output_bytes(spec, profile, exit) + packed_graph_bytes(spec, profile)
    total += graph_pool_top_up_bytes(spec, profile)
    if exit:
        total += logits_buffer_bytes(spec.vocab_size, profile, spec.hidden_size, spec.format)
    return total
