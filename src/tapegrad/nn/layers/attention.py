"""``MultiheadAttention`` (as in ``torch.nn``), with PyTorch's parameter names
(``in_proj_weight``, ``in_proj_bias``, ``out_proj``) and its forward's semantics."""
import math
import warnings

import tapegrad
from tapegrad.nn import functional as F
from tapegrad.nn.init import constant_, xavier_normal_, xavier_uniform_
from tapegrad.nn.module import Module
from tapegrad.nn.layers._utils import empty_parameter
from tapegrad.nn.layers.linear import NonDynamicallyQuantizableLinear

__all__ = ["MultiheadAttention"]


class MultiheadAttention(Module):
    """As ``torch.nn.MultiheadAttention(embed_dim, num_heads, dropout=0.0, bias=True,
    add_bias_kv=False, add_zero_attn=False, kdim=None, vdim=None, batch_first=False)``.

    ``forward(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
    average_attn_weights=True, is_causal=False)`` returns ``(output, weights or None)``.
    Masks are bool (True = may not attend) or float (added to the scores).
    """

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False,
                 add_zero_attn=False, kdim=None, vdim=None, batch_first=False, device=None,
                 dtype=None):
        if embed_dim <= 0 or num_heads <= 0:
            raise ValueError(f"embed_dim and num_heads must be greater than 0, got "
                             f"embed_dim={embed_dim} and num_heads={num_heads} instead")
        super().__init__()
        self.embed_dim = embed_dim
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.num_heads = num_heads
        self.dropout = dropout
        self.batch_first = batch_first
        self.head_dim = embed_dim // num_heads
        if self.head_dim * num_heads != embed_dim:
            raise AssertionError("embed_dim must be divisible by num_heads")
        if not self._qkv_same_embed_dim:
            self.q_proj_weight = empty_parameter((embed_dim, embed_dim), device, dtype)
            self.k_proj_weight = empty_parameter((embed_dim, self.kdim), device, dtype)
            self.v_proj_weight = empty_parameter((embed_dim, self.vdim), device, dtype)
            self.register_parameter("in_proj_weight", None)
        else:
            self.in_proj_weight = empty_parameter((3 * embed_dim, embed_dim), device, dtype)
            self.register_parameter("q_proj_weight", None)
            self.register_parameter("k_proj_weight", None)
            self.register_parameter("v_proj_weight", None)
        if bias:
            self.in_proj_bias = empty_parameter((3 * embed_dim,), device, dtype)
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = NonDynamicallyQuantizableLinear(embed_dim, embed_dim, bias=bias,
                                                        device=device, dtype=dtype)
        if add_bias_kv:
            self.bias_k = empty_parameter((1, 1, embed_dim), device, dtype)
            self.bias_v = empty_parameter((1, 1, embed_dim), device, dtype)
        else:
            self.bias_k = self.bias_v = None
        self.add_zero_attn = add_zero_attn
        self._reset_parameters()

    def _reset_parameters(self):
        if self._qkv_same_embed_dim:
            xavier_uniform_(self.in_proj_weight)
        else:
            xavier_uniform_(self.q_proj_weight)
            xavier_uniform_(self.k_proj_weight)
            xavier_uniform_(self.v_proj_weight)
        if self.in_proj_bias is not None:
            constant_(self.in_proj_bias, 0.0)
            constant_(self.out_proj.bias, 0.0)
        if self.bias_k is not None:
            xavier_normal_(self.bias_k)
        if self.bias_v is not None:
            xavier_normal_(self.bias_v)

    def forward(self, query, key, value, key_padding_mask=None, need_weights: bool = True,
                attn_mask=None, average_attn_weights: bool = True, is_causal: bool = False):
        is_batched = query.dim() == 3
        if self.batch_first and is_batched:
            if key is value:
                if query is key:
                    query = key = value = query.transpose(1, 0)
                else:
                    query, key = (x.transpose(1, 0) for x in (query, key))
                    value = key
            else:
                query, key, value = (x.transpose(1, 0) for x in (query, key, value))
        out, weights = _mha_forward(self, query, key, value, key_padding_mask, need_weights,
                                    attn_mask, average_attn_weights, is_causal)
        if self.batch_first and is_batched:
            out = out.transpose(1, 0)
        return out, weights


def _float_mask(mask, name, dtype):
    """A bool mask (True = blocked) as an additive float mask of ``dtype``; floats pass."""
    if mask is None:
        return None
    if mask.dtype == tapegrad.bool:
        neg_inf = tapegrad.full((), float("-inf"), dtype=dtype)
        return tapegrad.where(mask, neg_inf, tapegrad.zeros((), dtype=dtype))
    if not mask.dtype.is_floating_point:
        raise AssertionError(f"only bool and floating types of {name} are supported")
    return mask


def _shape_check(query, key, value, key_padding_mask, attn_mask, num_heads):
    if query.dim() == 3:
        if key.dim() != 3 or value.dim() != 3:
            raise AssertionError("For batched (3-D) `query`, expected `key` and `value` to be "
                                 f"3-D but found {key.dim()}-D and {value.dim()}-D tensors "
                                 "respectively")
        if key_padding_mask is not None and key_padding_mask.dim() != 2:
            raise AssertionError("For batched (3-D) `query`, expected `key_padding_mask` to be "
                                 f"`None` or 2-D but found {key_padding_mask.dim()}-D tensor "
                                 "instead")
        if attn_mask is not None and attn_mask.dim() not in (2, 3):
            raise AssertionError("For batched (3-D) `query`, expected `attn_mask` to be `None`, "
                                 f"2-D or 3-D but found {attn_mask.dim()}-D tensor instead")
        return True
    if query.dim() == 2:
        if key.dim() != 2 or value.dim() != 2:
            raise AssertionError("For unbatched (2-D) `query`, expected `key` and `value` to be "
                                 f"2-D but found {key.dim()}-D and {value.dim()}-D tensors "
                                 "respectively")
        if key_padding_mask is not None and key_padding_mask.dim() != 1:
            raise AssertionError("For unbatched (2-D) `query`, expected `key_padding_mask` to "
                                 f"be `None` or 1-D but found {key_padding_mask.dim()}-D tensor "
                                 "instead")
        if attn_mask is not None:
            if attn_mask.dim() not in (2, 3):
                raise AssertionError("For unbatched (2-D) `query`, expected `attn_mask` to be "
                                     f"`None`, 2-D or 3-D but found {attn_mask.dim()}-D tensor "
                                     "instead")
            expected = (num_heads, query.shape[0], key.shape[0])
            if attn_mask.dim() == 3 and tuple(attn_mask.shape) != expected:
                raise AssertionError(f"Expected `attn_mask` shape to be {expected} but got "
                                     f"{tuple(attn_mask.shape)}")
        return False
    raise AssertionError("query should be unbatched 2D or batched 3D tensor but received "
                         f"{query.dim()}-D query tensor")


def _append_zero_column(mask):
    """``F.pad(mask, (0, 1))`` for a constant mask: one more key position, not masked."""
    return tapegrad.cat([mask, tapegrad.zeros(tuple(mask.shape[:-1]) + (1,), dtype=mask.dtype)],
                        -1)


def _mha_forward(m, query, key, value, key_padding_mask, need_weights, attn_mask,
                 average_attn_weights, is_causal):
    """PyTorch's ``F.multi_head_attention_forward`` for module ``m``, on (L, B, E) inputs."""
    num_heads = m.num_heads
    is_batched = _shape_check(query, key, value, key_padding_mask, attn_mask, num_heads)
    if not is_batched:
        query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask.unsqueeze(0)
    tgt_len, bsz, embed_dim = query.shape
    src_len = key.shape[0]
    if (key_padding_mask is not None and attn_mask is not None
            and key_padding_mask.dtype != attn_mask.dtype):
        warnings.warn("Support for mismatched key_padding_mask and attn_mask is deprecated. Use "
                      "same type for both instead.", stacklevel=3)
    key_padding_mask = _float_mask(key_padding_mask, "key_padding_mask", query.dtype)
    if is_causal and attn_mask is None:
        raise RuntimeError("Need attn_mask if specifying the is_causal hint. You may use the "
                           "Transformer module method `generate_square_subsequent_mask` to "
                           "create this mask.")
    if is_causal and key_padding_mask is None and not need_weights:
        attn_mask = None  # the causal hint replaces the mask in scaled_dot_product_attention
    else:
        attn_mask = _float_mask(attn_mask, "attn_mask", query.dtype)
        if key_padding_mask is not None:
            is_causal = False
    if embed_dim != m.embed_dim:
        raise AssertionError(f"was expecting embedding dimension of {m.embed_dim}, but got "
                             f"{embed_dim}")
    head_dim = embed_dim // num_heads
    b = m.in_proj_bias
    E = embed_dim
    if m._qkv_same_embed_dim:
        if tuple(key.shape) != tuple(value.shape):
            raise AssertionError(f"key shape {tuple(key.shape)} does not match value shape "
                                 f"{tuple(value.shape)}")
        w = m.in_proj_weight
        if query is key and key is value:
            proj = F.linear(query, w, b)
            q, k, v = proj[..., :E], proj[..., E:2 * E], proj[..., 2 * E:]
        elif key is value:
            q = F.linear(query, w[:E], None if b is None else b[:E])
            kv = F.linear(key, w[E:], None if b is None else b[E:])
            k, v = kv[..., :E], kv[..., E:]
        else:
            q = F.linear(query, w[:E], None if b is None else b[:E])
            k = F.linear(key, w[E:2 * E], None if b is None else b[E:2 * E])
            v = F.linear(value, w[2 * E:], None if b is None else b[2 * E:])
    else:
        if tuple(key.shape[:2]) != tuple(value.shape[:2]):
            raise AssertionError(f"key's sequence and batch dims {tuple(key.shape[:2])} do not "
                                 f"match value's {tuple(value.shape[:2])}")
        q = F.linear(query, m.q_proj_weight, None if b is None else b[:E])
        k = F.linear(key, m.k_proj_weight, None if b is None else b[E:2 * E])
        v = F.linear(value, m.v_proj_weight, None if b is None else b[2 * E:])
    if attn_mask is not None:
        if attn_mask.dim() == 2:
            if tuple(attn_mask.shape) != (tgt_len, src_len):
                raise RuntimeError(f"The shape of the 2D attn_mask is {tuple(attn_mask.shape)}, "
                                   f"but should be {(tgt_len, src_len)}.")
            attn_mask = attn_mask.unsqueeze(0)
        elif tuple(attn_mask.shape) != (bsz * num_heads, tgt_len, src_len):
            raise RuntimeError(f"The shape of the 3D attn_mask is {tuple(attn_mask.shape)}, but "
                               f"should be {(bsz * num_heads, tgt_len, src_len)}.")
    if m.bias_k is not None and m.bias_v is not None:
        k = tapegrad.cat([k, m.bias_k.expand(1, bsz, E)])
        v = tapegrad.cat([v, m.bias_v.expand(1, bsz, E)])
        if attn_mask is not None:
            attn_mask = _append_zero_column(attn_mask)
        if key_padding_mask is not None:
            key_padding_mask = _append_zero_column(key_padding_mask)
    q = q.reshape(tgt_len, bsz * num_heads, head_dim).transpose(0, 1)
    k = k.reshape(k.shape[0], bsz * num_heads, head_dim).transpose(0, 1)
    v = v.reshape(v.shape[0], bsz * num_heads, head_dim).transpose(0, 1)
    if m.add_zero_attn:
        zeros = tapegrad.zeros((bsz * num_heads, 1, head_dim), dtype=k.dtype)
        k = tapegrad.cat([k, zeros], 1)
        v = tapegrad.cat([v, zeros], 1)
        if attn_mask is not None:
            attn_mask = _append_zero_column(attn_mask)
        if key_padding_mask is not None:
            key_padding_mask = _append_zero_column(key_padding_mask)
    src_len = k.shape[1]
    if key_padding_mask is not None:
        if tuple(key_padding_mask.shape) != (bsz, src_len):
            raise AssertionError(f"expecting key_padding_mask shape of {(bsz, src_len)}, but got "
                                 f"{tuple(key_padding_mask.shape)}")
        key_padding_mask = key_padding_mask.reshape(bsz, 1, 1, src_len).expand(
            bsz, num_heads, 1, src_len).reshape(bsz * num_heads, 1, src_len)
        attn_mask = key_padding_mask if attn_mask is None else attn_mask + key_padding_mask
    dropout_p = m.dropout if m.training else 0.0
    if need_weights:
        scores = (q * math.sqrt(1.0 / float(head_dim))) @ k.transpose(-2, -1)
        if attn_mask is not None:
            scores = attn_mask + scores
        weights = F.softmax(scores, dim=-1)
        if dropout_p > 0.0:
            weights = F.dropout(weights, p=dropout_p)
        out = (weights @ v).transpose(0, 1).reshape(tgt_len * bsz, embed_dim)
        out = F.linear(out, m.out_proj.weight, m.out_proj.bias).reshape(tgt_len, bsz, E)
        weights = weights.reshape(bsz, num_heads, tgt_len, src_len)
        if average_attn_weights:
            weights = weights.sum(1) / num_heads
        if not is_batched:
            out, weights = out.squeeze(1), weights.squeeze(0)
        return out, weights
    if attn_mask is not None:
        if attn_mask.shape[0] == 1 and attn_mask.dim() == 3:
            attn_mask = attn_mask.unsqueeze(0)
        else:
            if bsz == 0:  # PyTorch raises here too: -1 cannot be inferred from 0 elements
                raise RuntimeError(f"MultiheadAttention: cannot reshape the attn_mask of size "
                                   f"{list(attn_mask.shape)} into [0, {num_heads}, -1, "
                                   f"{src_len}] for an empty batch (the -1 is ambiguous)")
            attn_mask = attn_mask.reshape(bsz, num_heads, -1, src_len)
    q = q.reshape(bsz, num_heads, tgt_len, head_dim)
    k = k.reshape(bsz, num_heads, src_len, head_dim)
    v = v.reshape(bsz, num_heads, src_len, head_dim)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal)
    out = out.permute(2, 0, 1, 3).reshape(bsz * tgt_len, embed_dim)
    out = F.linear(out, m.out_proj.weight, m.out_proj.bias).reshape(tgt_len, bsz, E)
    if not is_batched:
        out = out.squeeze(1)
    return out, None
