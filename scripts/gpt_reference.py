#!/usr/bin/python3
"""Writes tests/fixtures/gpt_ref.bin: a small GPT, one batch, and what PyTorch computes from them, for
tests/nn/test_gpt_ref.c to hold tally's model to (as llm.c's test_gpt2 does). Run by hand with Debian's
python3-torch; the test itself needs no torch.

usage: scripts/gpt_reference.py [OUT]    (default tests/fixtures/gpt_ref.bin)

The model is the peer's (../shared/peers/ddp_gpt.py) written out again: token and position embeddings,
pre-LayerNorm blocks (causal self-attention, MLP 4C with tanh GELU), a final LayerNorm, the head tied to
the token embedding, GPT-2's initialisation, no dropout. L=2 C=64 H=4 T=32 B=2, vocabulary 256 (bytes).
Then 10 AdamW steps (lr 1e-3, betas 0.9/0.95, eps 1e-8, weight decay 0.1 on 2-D weights only, the
gradient's global norm clipped to 1.0), each step's loss before its update.

File: "TGPTREF1", u32 L C H T B V steps, then records: u32 name length, name, u32 dtype (0 f32, 1 i32),
u32 ndim, u32 shape[ndim], the data (little-endian). Records: tokens [B,T], targets [B,T], param.<name>
for every parameter, logits [B,T,V], loss [1], grad.<name> for every parameter, losses [steps].
"""
import math, struct, sys
import torch
import torch.nn as nn
import torch.nn.functional as F

L, C, H, T, B, V, STEPS = 2, 64, 4, 32, 2, 256, 10
TEXT = (b"In the beginning God created the heaven and the earth. And the earth was without form, and void; "
        b"and darkness was upon the face of the deep. And the Spirit of God moved upon the face of the waters.")


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.c_fc, self.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x):
        n, t, _ = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (z.view(n, t, H, C // H).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // H)
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        att = att.masked_fill(~causal, float('-inf')).softmax(dim=-1)
        x = x + self.c_proj((att @ v).transpose(1, 2).contiguous().view(n, t, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate='tanh'))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        self.h = nn.ModuleList(Block() for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                resid = name.endswith(('c_proj.weight', 'mlp_proj.weight'))
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * L) if resid else 0.02)
            elif name.endswith('bias'):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.h:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return logits, F.cross_entropy(logits.view(-1, V), targets.view(-1))


def record(out, name, t):
    t = t.detach().contiguous()
    dtype = 1 if t.dtype == torch.int32 else 0
    data = t.numpy().astype('<i4' if dtype else '<f4').tobytes()
    out.write(struct.pack('<I', len(name)) + name.encode() + struct.pack('<II', dtype, t.dim()))
    out.write(struct.pack('<%dI' % t.dim(), *t.shape) + data)


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else 'tests/fixtures/gpt_ref.bin'
    torch.manual_seed(1234)
    torch.set_num_threads(1)
    model = GPT()
    data = torch.tensor(list(TEXT[:B * (T + 1)]), dtype=torch.int32).view(B, T + 1)
    tokens, targets = data[:, :T].contiguous(), data[:, 1:].contiguous()
    decay = [p for p in model.parameters() if p.dim() == 2]
    rest = [p for p in model.parameters() if p.dim() != 2]
    opt = torch.optim.AdamW([{'params': decay, 'weight_decay': 0.1}, {'params': rest, 'weight_decay': 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    with open(path, 'wb') as out:
        out.write(b'TGPTREF1' + struct.pack('<7I', L, C, H, T, B, V, STEPS))
        record(out, 'tokens', tokens)
        record(out, 'targets', targets)
        for name, p in model.named_parameters():
            record(out, 'param.' + name, p)
        logits, loss = model(tokens.long(), targets.long())
        loss.backward()
        record(out, 'logits', logits)
        record(out, 'loss', loss.view(1))
        for name, p in model.named_parameters():
            record(out, 'grad.' + name, p.grad)
        losses = []
        for step in range(STEPS):
            opt.zero_grad()
            _, loss = model(tokens.long(), targets.long())
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(loss.item())
        record(out, 'losses', torch.tensor(losses, dtype=torch.float32))
    print('%s: %d parameters, loss %.6f, losses %s' % (path, sum(p.numel() for p in model.parameters()),
                                                      losses[0], ' '.join('%.4f' % l for l in losses)))


if __name__ == '__main__':
    main()
