"""DeepSpeed's ZeRO-3 memory estimators (`deepspeed.runtime.zero.stage3`):
bytes of model states per GPU and per node's CPU memory, for a model or a
parameter count, its largest layer and a cluster shape.

The figures are DeepSpeed's, for mixed-precision Adam training (see
stage_1_and_2), with every state sharded and the largest layer's 16-bit
params and grads gathered whole on a GPU; computed in DeepSpeed's order of
float operations, so that the truncated byte counts equal DeepSpeed's.
"""
from . import stage_1_and_2
from .stage_1_and_2 import _device, _hardware, _numel, _print_table


def model_to_params(model):
    """(total_params, largest_layer_params): the model's params, each storage
    counted once, and the most params any one module holds itself (its
    children's not counted) -- the unit ZeRO-3 gathers."""
    largest = max((sum(_numel(p) for p in m.parameters(recurse=False)) for m in model.modules()), default=0)
    return stage_1_and_2.model_to_params(model), largest


def estimate_zero3_model_states_mem_needs(total_params, largest_layer_params, num_gpus_per_node=1, num_nodes=1,
                                          cpu_offload=True, cpu_offload_params=True, zero_init=True,
                                          additional_buffer_factor=1.5):
    """(cpu_bytes, gpu_bytes, largest_layer_bytes) at ZeRO-3: model-state
    memory per node's CPU and per GPU with the optimizer (`cpu_offload`) and
    the params (`cpu_offload_params`, only with the optimizer) offloaded to
    the CPU or not, and the model built under zero.Init (`zero_init`) or
    whole on each rank first."""
    total_gpus = num_nodes * num_gpus_per_node
    node_share = 1 / num_nodes  # of the sharded states, the part a node's ranks hold
    # The largest layer gathered on a GPU: its 16-bit params and 16-bit grads.
    largest_layer_bytes = 4 * largest_layer_params
    if not cpu_offload:
        gpu = largest_layer_bytes + int(18 * total_params / total_gpus)
        # The CPU only holds fp32 weights before they move to the GPUs: one
        # layer at a time under zero.Init, else the whole model per local rank.
        built = largest_layer_params if zero_init else total_params
        cpu = built * 4 * num_gpus_per_node * additional_buffer_factor
    else:
        # The CPU holds 16 bytes/param of fp32 state (master params, grads,
        # moments), plus the 16-bit params when they are offloaded too.
        per_param = 18 if cpu_offload_params else 16
        if cpu_offload_params:
            gpu = largest_layer_bytes
        else:
            gpu = largest_layer_bytes + int(2 * total_params / total_gpus)
        if zero_init:
            cpu = total_params * per_param * node_share * additional_buffer_factor
        else:  # or the fp32 model each local rank builds first, if larger
            cpu = total_params * max(4 * num_gpus_per_node, per_param * node_share) * additional_buffer_factor
    return int(cpu), int(gpu), largest_layer_bytes


def estimate_zero3_model_states_mem_needs_all_live(model, num_gpus_per_node=1, num_nodes=1,
                                                   additional_buffer_factor=1.5):
    """Print the ZeRO-3 table (offload of params and optimizer, zero.Init or
    not) for `model`, an nn.Module: its params and largest layer counted as
    model_to_params does. For a model not built, use
    estimate_zero3_model_states_mem_needs_all_cold."""
    total_params, largest_layer_params = model_to_params(model)
    estimate_zero3_model_states_mem_needs_all_cold(total_params, largest_layer_params,
                                                   num_gpus_per_node=num_gpus_per_node, num_nodes=num_nodes,
                                                   additional_buffer_factor=additional_buffer_factor)


def estimate_zero3_model_states_mem_needs_all_cold(total_params, largest_layer_params, num_gpus_per_node=1,
                                                   num_nodes=1, additional_buffer_factor=1.5):
    """Print the ZeRO-3 table for a model of `total_params` params whose
    largest layer has `largest_layer_params`, on `num_nodes` nodes of
    `num_gpus_per_node` GPUs; `additional_buffer_factor` pads the CPU figures."""
    rows = []
    # Params are offloaded only along with the optimizer.
    for offload_optimizer, offload_params in ((True, True), (True, False), (False, False)):
        for zero_init in (True, False):
            cpu, gpu, _ = estimate_zero3_model_states_mem_needs(total_params, largest_layer_params,
                                                                num_gpus_per_node, num_nodes, offload_optimizer,
                                                                offload_params, zero_init, additional_buffer_factor)
            rows.append((cpu, gpu, f"offload_param={_device(offload_params):4}, "
                                   f"offload_optimizer={_device(offload_optimizer):4}, zero_init={int(zero_init)}"))
    _print_table(_hardware(num_gpus_per_node, num_nodes),
                 f"{int(total_params / 1e6)}M total params, {int(largest_layer_params / 1e6)}M largest layer params",
                 rows)
