"""DeepSpeed's memory-centric tiling (`deepspeed.zero.TiledLinear`,
zero3.rst): a Linear layer built as a grid of smaller Linears, so that at
stage 3 each tile is a unit of its own, gathered and released in turn --
one huge layer never whole in memory at once.

The grid is `out_splits` rows by `in_splits` columns, built row by row (the
init draws in DeepSpeed's order, so the same seed gives the same weights).
A tile's share of a dimension is as even as it can be, the first tiles one
larger where it does not divide; only the last column's tiles have a bias.
The forward splits the input's last dimension by the columns, sums each
row's tile outputs and joins the rows.
"""
import torch

from ... import zero


def uniform_parts(num_items, num_parts):
    """Boundaries (num_parts + 1 of them) of `num_items` cut into
    `num_parts` near-equal runs, the first ones longer by one where it does
    not divide; with fewer items than parts, one item each then none."""
    if num_items <= num_parts:
        return [min(p, num_items) for p in range(num_parts + 1)]
    size, extra = divmod(num_items, num_parts)
    return [p * size + min(p, extra) for p in range(num_parts + 1)]


class TiledLinear(torch.nn.Module):
    """`torch.nn.Linear(in_features, out_features, bias)` as an `out_splits`
    x `in_splits` grid of `linear_cls` tiles (`self.linears[row][col]`;
    `kwargs` go to each). `input_is_already_split`: the forward takes a
    list of `in_splits` inputs; `combine_out_splits=False`: it returns the
    rows' outputs as a list. `init_linear`: a Linear of the full size whose
    weights the tiles take (copy_params_from)."""

    def __init__(self, in_features, out_features, bias=True, in_splits=1, out_splits=1,
                 input_is_already_split=False, combine_out_splits=True, linear_cls=torch.nn.Linear,
                 init_linear=None, **kwargs):
        super().__init__()
        if not 1 <= in_splits <= in_features:
            raise RuntimeError(f"TiledLinear: in_splits must be in [1, in_features={in_features}], not {in_splits}")
        if not 1 <= out_splits <= out_features:
            raise RuntimeError(f"TiledLinear: out_splits must be in [1, out_features={out_features}], "
                               f"not {out_splits}")
        self.in_features, self.out_features, self.use_bias = in_features, out_features, bias
        self.in_splits, self.out_splits = in_splits, out_splits
        self.input_is_already_split, self.combine_out_splits = input_is_already_split, combine_out_splits
        self.in_parts = uniform_parts(in_features, in_splits)
        self.out_parts = uniform_parts(out_features, out_splits)
        self.linears = torch.nn.ModuleList()
        for row in range(out_splits):
            rows = self.out_parts[row + 1] - self.out_parts[row]
            self.linears.append(torch.nn.ModuleList(
                linear_cls(self.in_parts[col + 1] - self.in_parts[col], rows, bias=bias and col == in_splits - 1,
                           **kwargs)
                for col in range(in_splits)))
        if init_linear is not None:
            self.copy_params_from(init_linear)

    def forward(self, input_):
        if self.in_splits == 1:
            inputs = [input_]
        elif self.input_is_already_split:
            if len(input_) != self.in_splits:
                raise ValueError(f"TiledLinear: {len(input_)} inputs given for in_splits={self.in_splits}")
            inputs = input_
        else:
            parts = uniform_parts(input_.shape[-1], self.in_splits)
            inputs = self._split_global_input(input_, [b - a for a, b in zip(parts, parts[1:])])
        outputs = []
        for row in range(self.out_splits):
            out = None
            for col in range(self.in_splits):
                out = self._reduce_local_output(col, row, out, self.linears[row][col](inputs[col]))
            outputs.append(out)
        return self._combine_output_splits(outputs) if self.combine_out_splits else outputs

    # The three steps a subclass may change (TiledLinearReturnBias does).
    def _split_global_input(self, input, split_sizes):
        return torch.split(input, split_sizes, dim=-1)

    def _reduce_local_output(self, in_id, out_id, current_out, new_out):
        return new_out.clone() if current_out is None else current_out + new_out

    def _combine_output_splits(self, outputs):
        return torch.cat(outputs, dim=-1)

    @torch.no_grad()
    def copy_params_from(self, other):
        """The tiles take `other`'s weight (and bias) slices. At stage 3 (a
        model built under zero.Init) it is collective: rank 0's values reach
        every rank, as GatheredParameters(modifier_rank=0) writes them."""
        assert other.weight.size() == (self.out_features, self.in_features), \
            f"TiledLinear.copy_params_from: weight of shape {tuple(other.weight.shape)}, not " \
            f"{(self.out_features, self.in_features)}"
        assert (getattr(other, "bias", None) is not None) == bool(self.use_bias), \
            "TiledLinear.copy_params_from: the other layer's bias does not match this one's"
        for row in range(self.out_splits):
            r0, r1 = self.out_parts[row], self.out_parts[row + 1]
            for col in range(self.in_splits):
                c0, c1 = self.in_parts[col], self.in_parts[col + 1]
                tile = self.linears[row][col]
                with zero.GatheredParameters([tile.weight], modifier_rank=0):
                    tile.weight.copy_(other.weight[r0:r1, c0:c1])
                if tile.bias is not None:
                    with zero.GatheredParameters([tile.bias], modifier_rank=0):
                        tile.bias.copy_(other.bias[r0:r1])


class TiledLinearReturnBias(TiledLinear):
    """TiledLinear over tiles that return `(output, bias)` (Megatron-LM's
    Linears, which leave adding the bias to the caller): the outputs are
    summed and joined as above, the biases (the last column's) joined."""

    def _reduce_local_output(self, in_id, out_id, current_out, new_out):
        tensor, bias = new_out
        old_tensor, old_bias = current_out if current_out is not None else (None, None)
        return super()._reduce_local_output(in_id, out_id, old_tensor, tensor), bias if bias is not None else old_bias

    def _combine_output_splits(self, outputs):
        biases = [b for _, b in outputs if b is not None]
        return (super()._combine_output_splits([t for t, _ in outputs]),
                super()._combine_output_splits(biases) if biases else None)
