"""DeepSpeed's ZeRO-2 memory estimators (`deepspeed.runtime.zero.stage_1_and_2`):
bytes of model states -- params, grads, Adam's moments -- per GPU and per
node's CPU memory, for a model or a parameter count and a cluster shape.

The figures are DeepSpeed's, for mixed-precision Adam training: 16-bit
params on the GPU, fp32 master params, fp32 grads and the two fp32 moments
sharded over the data-parallel ranks. Activations and temporary buffers are
not counted. Computed in DeepSpeed's order of float operations, so that the
truncated byte counts equal DeepSpeed's to the byte.
"""

_GiB = 2**30


def _numel(p):
    # A stage-3 param released to its shard keeps its full size in ds_numel.
    return getattr(p, "ds_numel", p.numel())


def model_to_params(model):
    """The model's number of params, each storage counted once (weights tied
    through distinct Parameter objects share one)."""
    # Tensors without storage (meta, released) all report data_ptr() == 0:
    # they are told apart by identity instead.
    sizes = {(p.data_ptr() or ("id", id(p))): _numel(p) for p in model.parameters()}
    return sum(sizes.values())


def estimate_zero2_model_states_mem_needs(total_params, num_gpus_per_node=1, num_nodes=1, cpu_offload=True,
                                          additional_buffer_factor=1.5):
    """(cpu_bytes, gpu_bytes): model-state memory per node's CPU and per GPU
    at ZeRO-2, with the optimizer offloaded to the CPU (`cpu_offload`) or not."""
    total_gpus = num_nodes * num_gpus_per_node
    if cpu_offload:
        # The GPU keeps the 16-bit params; the CPU holds the fp32 model each
        # local rank builds, or the 16 bytes/param of fp32 state, the larger.
        gpu = 2 * total_params
        cpu = total_params * max(4 * total_gpus, 16) * additional_buffer_factor
    else:
        # 16-bit params whole, plus 18 bytes/param sharded: 16-bit and fp32
        # grads, fp32 master params, Adam's two moments. The CPU only holds
        # the fp32 model each local rank builds before moving it.
        gpu = 2 * total_params + int(18 * total_params / total_gpus)
        cpu = total_params * 4 * num_gpus_per_node * additional_buffer_factor
    return int(cpu), int(gpu)


def _print_table(hardware, software, rows):
    """DeepSpeed's printed table: rows of (cpu_bytes, gpu_bytes, options)."""
    print("Estimated memory needed for params, optim states and gradients for a:\n"
          f"HW: Setup with {hardware}.\nSW: Model with {software}.")
    print("  per CPU  |  per GPU |   Options")
    for cpu, gpu, options in rows:
        print(f" {cpu / _GiB:7.2f}GB | {gpu / _GiB:6.2f}GB | {options}")


def _hardware(num_gpus_per_node, num_nodes):
    return (f"{num_nodes} node{'s' if num_nodes > 1 else ''}, "
            f"{num_gpus_per_node} GPU{'s' if num_gpus_per_node > 1 else ''} per node")


def _device(offloaded):
    return "cpu" if offloaded else "none"


def estimate_zero2_model_states_mem_needs_all_live(model, num_gpus_per_node=1, num_nodes=1,
                                                   additional_buffer_factor=1.5):
    """Print the ZeRO-2 table (with and without optimizer offload) for
    `model`, an nn.Module: its params counted as model_to_params does.
    For a model not built, use estimate_zero2_model_states_mem_needs_all_cold."""
    estimate_zero2_model_states_mem_needs_all_cold(model_to_params(model), num_gpus_per_node=num_gpus_per_node,
                                                   num_nodes=num_nodes,
                                                   additional_buffer_factor=additional_buffer_factor)


def estimate_zero2_model_states_mem_needs_all_cold(total_params, num_gpus_per_node=1, num_nodes=1,
                                                   additional_buffer_factor=1.5):
    """Print the ZeRO-2 table (with and without optimizer offload) for a
    model of `total_params` params, on `num_nodes` nodes of
    `num_gpus_per_node` GPUs; `additional_buffer_factor` pads the CPU figures."""
    rows = []
    for offload in (True, False):
        cpu, gpu = estimate_zero2_model_states_mem_needs(total_params, num_gpus_per_node, num_nodes, offload,
                                                         additional_buffer_factor)
        rows.append((cpu, gpu, f"offload_optimizer={_device(offload)}"))
    _print_table(_hardware(num_gpus_per_node, num_nodes), f"{int(total_params / 1e6)}M total params", rows)
