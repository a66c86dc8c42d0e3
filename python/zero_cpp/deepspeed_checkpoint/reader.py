"""A checkpoint DeepSpeed 0.19.8 saved (engine.save_checkpoint), read
without DeepSpeed: what its tag directory holds, and from it each trainable
param's full fp32 master and Adam moments, the frozen params and buffers,
the step counters, the loss scaler, the LR scheduler's state, the optimizer's
param groups and the script's client_state.

The files, by stage:
- mp_rank_00_model_states.pt (stage 3: zero_pp_rank_R_mp_rank_00_model_states.pt,
  one per rank): the module's state dict (stage 3: empty params, each rank's
  partition of the frozen ones in frozen_param_fragments), the names of the
  trainable params in flat-buffer order (param_shapes), tied params
  (shared_params), the counters, the scheduler, the ds_config; and every
  key of the script's client_state beside them.
- [bf16_]zero_pp_rank_R_mp_rank_00_optim_states.pt, one per rank (ZeRO
  stages 1-3): rank R's partition of the fp32 masters and of the
  optimizer's state (layouts.py says how they are cut).
- Stage 0 keeps the optimizer's state in the model-states file: the basic
  optimizer's in fp32, the fp16/bf16 wrapper's (its fp32 masters, the
  basic optimizer's state over them, the loss scaler) otherwise.
"""
import os
import re

import torch

from .errors import DeepSpeedCheckpointError
from .layouts import FlatGroups, ParamPartitions, WholeParams
from .unpickling import DeepSpeedObject, load

_MODEL_STATES = "mp_rank_00_model_states.pt"
_ZERO3_MODEL_STATES = "zero_pp_rank_{}_mp_rank_00_model_states.pt"
_OPTIM_STATES = re.compile(r"(bf16_)?zero_pp_rank_(\d+)_mp_rank_00_optim_states\.pt")

# What DeepSpeed's save puts in the model-states dict; every other key is the script's client_state.
_DEEPSPEED_KEYS = frozenset({
    "module", "buffer_names", "optimizer", "param_shapes", "frozen_param_shapes", "shared_params",
    "frozen_param_fragments", "lr_scheduler", "data_sampler", "random_ltd", "skipped_steps", "global_steps",
    "global_samples", "dp_world_size", "mp_world_size", "checkpoint_parallel_dimensions", "ds_config", "ds_version",
    "universal_checkpoint_info"})


def tag_path(ds_dir, tag=None):
    """ds_dir/tag, the tag being the one DeepSpeed's `latest` names when None."""
    if tag is None:
        try:
            with open(os.path.join(ds_dir, "latest")) as f:
                tag = f.read().strip()
        except OSError as e:
            raise DeepSpeedCheckpointError(f"{ds_dir} has no 'latest' file naming a tag: {e}") from None
    return os.path.join(ds_dir, str(tag))


def is_deepspeed_checkpoint(ds_dir, tag=None):
    """Whether ds_dir/tag (tag None: the one `latest` names) is a checkpoint
    DeepSpeed wrote, rather than zero-cpp (its manifest.json)."""
    try:
        path = tag_path(ds_dir, tag)
    except DeepSpeedCheckpointError:
        return False
    if os.path.exists(os.path.join(path, "manifest.json")):
        return False
    return any(os.path.isfile(os.path.join(path, f)) for f in (_MODEL_STATES, _ZERO3_MODEL_STATES.format(0)))


def _int(value):
    return int(value.item() if torch.is_tensor(value) else value)


class DeepSpeedCheckpoint:
    """One tag of a DeepSpeed checkpoint. `model` and `param_groups` (the
    model it will be loaded into, its optimizer's param groups) are needed
    only where the files lack something: a stage-0 checkpoint names its
    optimizer state by position in the param groups, and no checkpoint holds
    the model's non-persistent buffers."""

    def __init__(self, ds_dir, tag=None, model=None, param_groups=None):
        self.path = tag_path(ds_dir, tag)
        if not is_deepspeed_checkpoint(ds_dir, tag):
            raise DeepSpeedCheckpointError(f"{self.path} is not a DeepSpeed checkpoint (no {_MODEL_STATES} or "
                                           f"{_ZERO3_MODEL_STATES.format(0)})")
        self._refuse_layouts()
        stage3 = os.path.isfile(os.path.join(self.path, _ZERO3_MODEL_STATES.format(0)))
        self._main = load(os.path.join(self.path, _ZERO3_MODEL_STATES.format(0) if stage3 else _MODEL_STATES))
        main = self._main
        for key in ("module", "buffer_names", "global_steps", "ds_config"):
            if key not in main:
                raise DeepSpeedCheckpointError(f"{self.path}: its model-states file has no '{key}'; not a checkpoint "
                                               f"of DeepSpeed's engine.save_checkpoint")
        self._refuse_parallelism()
        self.config = main["ds_config"]
        if not isinstance(self.config, dict):
            raise DeepSpeedCheckpointError(f"{self.path}: its ds_config is a {type(self.config).__name__}, not a dict")
        self.precision = "bf16" if _enabled(self.config, "bf16", "bfloat16") else \
            "fp16" if _enabled(self.config, "fp16") else "fp32"
        self.global_steps = _int(main["global_steps"])
        self.skipped_steps = _int(main.get("skipped_steps", 0))
        self.lr_scheduler = main.get("lr_scheduler")
        self.client_state = {k: v for k, v in main.items() if k not in _DEEPSPEED_KEYS}
        module = main["module"]
        buffers = [n for n in main["buffer_names"] if n in module]
        shared = main.get("shared_params")
        self.aliases = dict(shared) if shared is not None else _tied(module, set(buffers))
        # Params in registration order (the module's state dict lists them so), each once.
        not_params = set(buffers) | set(self.aliases)
        self._module_params = [n for n in module if n not in not_params]
        self._hint = _Hint(model, param_groups)

        optim_files = self._optim_files()
        self.world_size = len(optim_files) or _int(main.get("dp_world_size", 1))
        states = [load(f)["optimizer_state_dict"] for f in optim_files]
        stage = _zero_stage(states[0]) if states else 0
        if stage is None:  # DeepSpeed's BF16_Optimizer (ZeRO-1 of bf16 params accumulating fp32 grads) records none
            stage = 1
        # Each layout gives the trainable params' shapes (name -> shape), how
        # to read them, the optimizer's param groups, Adam's step counts and
        # the loss scaler.
        if stage in (1, 2):
            trainable, layout, groups, steps, scaler = self._zero_1_2(states)
        elif stage == 3:
            trainable, layout, groups, steps, scaler = self._zero_3(states)
        elif main.get("optimizer") is None:
            raise DeepSpeedCheckpointError(f"{self.path} holds no optimizer state (saved without an optimizer?)")
        else:
            trainable, layout, groups, steps, scaler = self._stage_0(main["optimizer"])
        self.stage = stage
        unnamed = set(trainable) - set(self._module_params)
        if unnamed:
            raise DeepSpeedCheckpointError(f"{self.path}: the optimizer holds {sorted(unnamed)}, which the module's "
                                           f"state dict does not name")
        self.params = [(n, tuple(trainable[n])) for n in self._module_params if n in trainable]
        self.read = layout.read
        self.param_groups = [{k: v for k, v in g.items() if k != "params"} for g in groups]
        self.optimizer = _optimizer_name(self.config, groups, self.path)
        if len(steps) > 1:
            raise DeepSpeedCheckpointError(f"{self.path}: the params' Adam step counts differ ({sorted(steps)}); "
                                           f"zero-cpp keeps one count for all")
        self.optimizer_steps = steps.pop() if steps else 0
        self.loss_scaler = scaler
        self.replicated = self._replicated(module, buffers, trainable)

    # ---- what cannot be converted ----
    def _refuse_layouts(self):
        """What the files' names alone show cannot be converted."""
        for name in sorted(os.listdir(self.path)):
            mp = re.search(r"mp_rank_(\d+)", name)
            why = ("a universal checkpoint (ds_to_universal's output); convert the ZeRO checkpoint it was made from "
                   "instead" if name == "zero" else
                   "saved with the optimizer offloaded to NVMe: its state is in DeepSpeed's swap files, not in the "
                   "checkpoint" if name == "offloaded_tensors" else
                   "saved with pipeline parallelism" if name.startswith("layer_") else
                   "saved with a mixture of experts" if name.startswith("expp_rank_") or "expert_" in name else
                   "saved with model (tensor) parallelism" if mp and int(mp.group(1)) != 0 else None)
            if why:
                raise DeepSpeedCheckpointError(f"{self.path} is {why} ({name}); zero-cpp converts data-parallel "
                                               f"ZeRO checkpoints")

    def _refuse_parallelism(self):
        main = self._main
        dims = main.get("checkpoint_parallel_dimensions") or {}
        degrees = {"model": _int(main.get("mp_world_size", 1)), "pipeline": dims.get("pp_degree", 1),
                   "tensor": dims.get("tp_degree", 1)}
        for what, degree in degrees.items():
            if degree not in (None, 1):
                raise DeepSpeedCheckpointError(f"{self.path} was saved with {what} parallelism (degree {degree}); "
                                               f"zero-cpp is data parallel only")
        if "universal_checkpoint_info" in main:
            raise DeepSpeedCheckpointError(f"{self.path} was saved with automatic tensor parallelism "
                                           f"(universal_checkpoint_info); zero-cpp is data parallel only")
        for key, what in (("data_sampler", "curriculum learning (its data sampler)"), ("random_ltd", "random-LTD")):
            if main.get(key) is not None:
                raise DeepSpeedCheckpointError(f"{self.path} holds the state of DeepSpeed's {what}, which zero-cpp "
                                               f"does not have")

    def _optim_files(self):
        by_rank = {}
        for name in os.listdir(self.path):
            m = _OPTIM_STATES.fullmatch(name)
            if m:
                by_rank[int(m.group(2))] = os.path.join(self.path, name)
        if sorted(by_rank) != list(range(len(by_rank))):
            raise DeepSpeedCheckpointError(f"{self.path}: optimizer files for ranks {sorted(by_rank)}, not 0 to "
                                           f"{len(by_rank) - 1} (a save that did not finish on every rank?)")
        return [by_rank[r] for r in range(len(by_rank))]

    def _check_partitions(self, states):
        for r, s in enumerate(states):
            counts = s.get("partition_count")
            counts = counts if isinstance(counts, (list, tuple)) else [counts]
            if any(c != len(states) for c in counts):
                raise DeepSpeedCheckpointError(f"{self.path}: rank {r}'s optimizer file says it is one of {counts} "
                                               f"partitions, but {len(states)} optimizer files are there")

    # ---- the layouts ----
    def _zero_1_2(self, states):
        """ZeRO-1/2, and the BF16_Optimizer (whose partitions keep their padding)."""
        self._check_partitions(states)
        shapes = self._main["param_shapes"]
        layout = FlatGroups(self.path)
        steps = set()
        paddings = states[0].get("param_alignment_paddings")  # absent before DeepSpeed aligned params
        for g, params in enumerate(shapes):
            pads = paddings[g] if paddings else [0] * len(params)
            parts = {"master": [s["single_partition_of_fp32_groups"][g] for s in states]}
            for s in states:
                base = s["base_optimizer_state"]
                # elastic_checkpoint: one state per group, its step beside them;
                # otherwise the basic optimizer's state_dict, group g's flat param at index g.
                state = base[g] if isinstance(base, list) else base["state"].get(g, {})
                _add_moments(parts, state)
                steps |= _steps([state], [] if isinstance(base, list) else base["param_groups"])
                if "base_optimizer_state_step" in s:
                    steps.add(_int(s["base_optimizer_state_step"]))
            layout.add_group([(n, shape, pad) for (n, shape), pad in zip(params.items(), pads)], parts)
        base = states[0]["base_optimizer_state"]
        groups = [] if isinstance(base, list) else base["param_groups"]  # elastic saves no group settings
        trainable = {n: shape for params in shapes for n, shape in params.items()}
        return trainable, layout, groups, steps, _scaler(states[0].get("loss_scaler"))

    def _zero_3(self, states):
        self._check_partitions(states)
        if "ds_zero_partition_groups" in states[0]:
            raise DeepSpeedCheckpointError(f"{self.path} holds AutoEP expert partitions; zero-cpp is data parallel "
                                           f"only")
        shapes = self._main["param_shapes"]
        missing = [f for f in (_ZERO3_MODEL_STATES.format(r) for r in range(len(states)))
                   if not os.path.isfile(os.path.join(self.path, f))]
        if missing:  # they hold each rank's partition of the frozen params
            raise DeepSpeedCheckpointError(f"{self.path} lacks {missing} (a save that did not finish on every rank?)")
        layout = ParamPartitions(self.path, len(states))
        steps = set()
        torch_states = [s["optimizer_state_dict"] for s in states]
        for sub, params in enumerate(shapes):  # sub-group k's flat is the optimizer's param k
            flats = {"master": [s["fp32_flat_groups"][sub] for s in states]}
            for t in torch_states:
                _add_moments(flats, t["state"].get(sub, {}))
                steps |= _steps([t["state"].get(sub, {})], t["param_groups"])
            layout.add_sub_group(list(params.items()), flats)
        trainable = {n: shape for params in shapes for n, shape in params.items()}
        return trainable, layout, torch_states[0]["param_groups"], steps, _scaler(states[0].get("loss_scaler"))

    def _stage_0(self, opt):
        module = self._main["module"]
        if "fp32_groups_flat" in opt or "fp32_groups" in opt:  # fp16: the fused or the unfused optimizer
            torch_state = opt["optimizer_state_dict"]
            names = self._stage_0_trainable(len(torch_state["param_groups"]))
            if "fp32_groups_flat" in opt:
                layout = FlatGroups(self.path)
                for g, group in enumerate(names):
                    parts = {"master": [opt["fp32_groups_flat"][g]]}
                    _add_moments(parts, torch_state["state"].get(torch_state["param_groups"][g]["params"][0], {}))
                    self._stage_0_group(layout, [(n, module[n].shape, 0) for n in group], parts)
            else:
                layout = WholeParams()
                for g, group in enumerate(names):
                    masters, positions = opt["fp32_groups"][g], torch_state["param_groups"][g]["params"]
                    if len(masters) != len(group):
                        raise self._needs_groups(f"param group {g} holds {len(masters)} fp32 params, the model's "
                                                 f"{len(group)} trainable ones")
                    for name, master, position in zip(group, masters, positions):
                        if tuple(master.shape) != tuple(module[name].shape):
                            raise self._needs_groups(f"param group {g}'s fp32 param of shape "
                                                     f"{tuple(master.shape)} is not {name}'s")
                        layout.add(name, {"master": master, **torch_state["state"].get(position, {})})
            scaler = {"cur_scale": opt["cur_scale"], "cur_iter": opt.get("cur_iter", 0),
                      "last_overflow_iter": opt.get("last_overflow_iter", -1)}
            steps = _steps(torch_state["state"].values(), torch_state["param_groups"])
            return self._shapes(names), layout, torch_state["param_groups"], steps, scaler
        # fp32: the basic optimizer itself, over the module's own params.
        groups = self._stage_0_groups(len(opt["param_groups"]))
        layout = WholeParams()
        trainable = {}
        for g, (names, group) in enumerate(zip(groups, opt["param_groups"])):
            if len(names) != len(group["params"]):
                raise self._needs_groups(f"param group {g} holds {len(group['params'])} params, not {len(names)}")
            for name, position in zip(names, group["params"]):
                state = opt["state"].get(position, {})
                # No hint: what Adam holds state for was trained (before any step, all of it).
                trains = self._hint.trains(name) if self._hint else bool(state) or not opt["state"]
                if not trains:
                    continue
                if "exp_avg" in state and tuple(state["exp_avg"].shape) != tuple(module[name].shape):
                    raise self._needs_groups(f"param group {g}'s state at position {position} has shape "
                                             f"{tuple(state['exp_avg'].shape)}, not {name}'s")
                layout.add(name, {"master": module[name], **state})
                trainable[name] = module[name].shape
        return trainable, layout, opt["param_groups"], _steps(opt["state"].values(), opt["param_groups"]), None

    def _stage_0_groups(self, count):
        """Each param group's param names, in the order its state numbers them."""
        if self._hint:
            groups = self._hint.groups()
        elif count == 1:
            groups = [self._module_params]  # model.parameters(), as most scripts pass
        else:
            raise self._needs_groups(f"it has {count} param groups")
        if len(groups) != count:
            raise self._needs_groups(f"it has {count} param groups, the model's optimizer {len(groups)}")
        return groups

    def _stage_0_trainable(self, count):
        """Each group's params the optimizer holds (trainable, not empty), in order."""
        module = self._main["module"]
        return [[n for n in group if module[n].numel() > 0 and (not self._hint or self._hint.trains(n))]
                for group in self._stage_0_groups(count)]

    def _stage_0_group(self, layout, params, parts):
        try:
            layout.add_group(params, parts)
        except DeepSpeedCheckpointError as e:
            raise self._needs_groups(str(e)) from None

    def _shapes(self, names):
        return {n: self._main["module"][n].shape for group in names for n in group}

    def _needs_groups(self, problem):
        return DeepSpeedCheckpointError(
            f"{self.path}: a stage-0 checkpoint numbers its optimizer state by position in the param groups, and "
            f"{problem}: pass the model and its optimizer's param_groups (engine.load_checkpoint does) so the "
            f"positions can be named")

    # ---- frozen params and buffers ----
    def _replicated(self, module, buffers, trainable):
        main = self._main
        frozen_shapes = main.get("frozen_param_shapes")
        if frozen_shapes is None:  # stages 0 and 1: the module's state dict holds them whole
            frozen = [(n, module[n]) for n in self._module_params if n not in trainable]
        elif self.stage == 3:  # each rank's partition, in its own model-states file
            fragments = [main["frozen_param_fragments"]] + [
                load(os.path.join(self.path, _ZERO3_MODEL_STATES.format(r)))["frozen_param_fragments"]
                for r in range(1, self.world_size)]
            frozen = [(n, torch.cat([f[n].reshape(-1) for f in fragments])[:shape.numel()].reshape(shape))
                      for n, shape in frozen_shapes.items()]
        else:  # stage 2: whole, beside the module
            frozen = [(n, main["frozen_param_fragments"][n].reshape(shape)) for n, shape in frozen_shapes.items()]
        return ([(n, "param", t) for n, t in frozen] + [(n, "buffer", module[n]) for n in buffers] +
                [(n, "buffer", t) for n, t in self._hint.non_persistent_buffers()])


def _enabled(config, *blocks):
    return any(isinstance(config.get(b), dict) and config[b].get("enabled", False) for b in blocks)


def _zero_stage(state):
    stage = state.get("zero_stage")
    if stage is None:
        return None
    return int(stage.args[0] if isinstance(stage, DeepSpeedObject) else stage)


def _add_moments(parts, state):
    for kind in ("exp_avg", "exp_avg_sq"):
        if kind in state:
            parts.setdefault(kind, []).append(state[kind])


def _steps(states, groups):
    """Adam's step counts: torch's Adam and DeepSpeedCPUAdam keep one in each
    param's state, FusedAdam one per group (DeepSpeedCPUAdam's group count
    stays 0)."""
    found = {_int(s["step"]) for s in states if "step" in s}
    return found or {_int(g["step"]) for g in groups if "step" in g}


def _scaler(scaler):
    """A ZeRO optimizer's loss scaler: DeepSpeed's LossScaler (static) or DynamicLossScaler."""
    if scaler is None:
        return None
    return {k: getattr(scaler, k) for k in ("cur_scale", "cur_iter", "last_overflow_iter", "cur_hysteresis")
            if hasattr(scaler, k)}


def _tied(module, buffers):
    """Stage 0 records no shared_params: tied params are the state dict's
    entries over one storage (torch.save keeps them shared)."""
    first, aliases = {}, {}
    for name, t in module.items():
        if name in buffers or t.numel() == 0:
            continue
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride())
        if key in first:
            aliases[name] = first[key]
        else:
            first[key] = name
    return aliases


def _optimizer_name(config, groups, path):
    """"Adam" or "AdamW": zero-cpp's checkpoints hold Adam's state (two moments) only."""
    block = config.get("optimizer")
    if isinstance(block, dict):
        kind = str(block.get("type", "")).lower()
        if kind in ("adam", "adamw"):
            return "AdamW" if kind == "adamw" else "Adam"
        raise DeepSpeedCheckpointError(f"{path} holds the state of a {block.get('type')} optimizer; zero-cpp "
                                       f"converts Adam's and AdamW's")
    # An optimizer given in code, known by its groups' settings: torch's Adam
    # and AdamW have "amsgrad", DeepSpeed's FusedAdam and DeepSpeedCPUAdam
    # "bias_correction" (as has FusedLamb, with "max_coeff"); RAdam, NAdam
    # and Adamax, Adam-like in name and settings, have neither.
    settings = set().union(*(g.keys() for g in groups)) - {"params"}
    adam = {"betas", "eps"} <= settings and bool({"amsgrad", "bias_correction"} & settings)
    if not adam or "max_coeff" in settings or any(g.get("amsgrad") for g in groups):
        raise DeepSpeedCheckpointError(f"{path} holds the state of an optimizer given in code whose settings "
                                       f"({sorted(settings)}) are not those of Adam or AdamW (without amsgrad); "
                                       f"zero-cpp converts Adam's and AdamW's")
    decoupled = any(g.get("decoupled_weight_decay") or g.get("adam_w_mode") for g in groups)
    return "AdamW" if decoupled else "Adam"


class _Hint:
    """The loading model and its optimizer's param groups, where given."""

    def __init__(self, model, param_groups):
        self._model, self._groups = model, param_groups
        self._names = {id(p): n for n, p in model.named_parameters()} if model is not None else {}
        self._trains = {n: p.requires_grad for n, p in model.named_parameters()} if model is not None else {}

    def __bool__(self):
        return self._model is not None and self._groups is not None

    def trains(self, name):
        return self._trains.get(name, False)

    def groups(self):
        out = []
        for g, group in enumerate(self._groups):
            params = group["params"] if isinstance(group, dict) else group
            unknown = [tuple(p.shape) for p in params if id(p) not in self._names]
            if unknown:
                raise DeepSpeedCheckpointError(f"param group {g} holds tensors that are not the model's params "
                                               f"(shapes {unknown[:3]})")
            out.append([self._names[id(p)] for p in params])
        return out

    def non_persistent_buffers(self):
        """DeepSpeed saves none of them; its load leaves them as the model has them, and so does this."""
        if self._model is None:
            return []
        out = []
        for prefix, module in self._model.named_modules():
            for name in module._non_persistent_buffers_set:
                t = module._buffers.get(name)
                if t is not None:
                    out.append((f"{prefix}.{name}" if prefix else name, t))
        return out
