"""The GPU path: the model, attention (fused and from scratch), MoE, LoRA, training and RL on CUDA
(bf16 included) agree with the CPU. Marked ``gpu``; each test is skipped, with its reason shown
in the summary (``-ra``), on a machine without a CUDA GPU. Run them alone with ``pytest -m gpu``."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from course_lib import attention, generation, lora, moe, moe_runs, rlhf, train
from course_lib import model as M

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs a CUDA GPU (run on a GPU machine)")]

CUDA = torch.device("cuda")
CONFIGS = {
    "gpt2-like": M.ModelConfig(vocab_size=97, context_length=32, d_model=64, n_layers=2, n_heads=4),
    "llama-like": M.ModelConfig(vocab_size=97, context_length=32, d_model=64, n_layers=2, n_heads=4,
                                n_kv_heads=2, norm="rmsnorm", positional="rope", mlp="swiglu", bias=False,
                                tie_embeddings=False),
    "moe": M.ModelConfig(vocab_size=97, context_length=32, d_model=64, n_layers=2, n_heads=4,
                         moe=moe.MoEConfig(n_experts=4, top_k=2, capacity_factor=None)),
}


def _batch(config: M.ModelConfig, B: int = 4, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, config.vocab_size, (B, config.context_length),
                         generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("impl", ["naive", "sdpa"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_model_forward_and_backward_on_cuda_equal_the_cpu(name, impl):
    config = dataclasses.replace(CONFIGS[name], attn_impl=impl)
    torch.manual_seed(0)
    cpu_model = M.GPT(config)
    gpu_model = copy.deepcopy(cpu_model).to(CUDA)
    idx = _batch(config)
    logits, loss = cpu_model(idx, idx)
    loss.backward()
    logits_gpu, loss_gpu = gpu_model(idx.to(CUDA), idx.to(CUDA))
    loss_gpu.backward()
    torch.testing.assert_close(logits_gpu.cpu(), logits, atol=1e-4, rtol=1e-4)
    for (n, p), p_gpu in zip(cpu_model.named_parameters(), gpu_model.parameters(), strict=True):
        torch.testing.assert_close(p_gpu.grad.cpu(), p.grad, atol=1e-4, rtol=1e-3, msg=n)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_bf16_autocast_on_cuda_stays_close_to_fp32(name):
    if not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    torch.manual_seed(0)
    gpt = M.GPT(CONFIGS[name]).to(CUDA)
    idx = _batch(CONFIGS[name]).to(CUDA)
    _, loss32 = gpt(idx, idx)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits16, loss16 = gpt(idx, idx)
    assert logits16.dtype == torch.bfloat16 and loss16.dtype == torch.float32  # the loss is computed in fp32
    assert abs(loss16.item() - loss32.item()) < 0.05


def test_attention_from_scratch_equals_the_fused_kernel_on_cuda():
    q, k, v = (torch.randn(2, 8, 128, 64, device=CUDA) for _ in range(3))
    mask = attention.causal_mask(128, device=CUDA)
    naive = attention.scaled_dot_product_attention(q, k, v, mask, impl="naive")
    fused = attention.scaled_dot_product_attention(q, k, v, mask, impl="sdpa")
    torch.testing.assert_close(naive, fused, atol=1e-4, rtol=1e-4)


def test_moe_routes_in_fp32_and_dispatch_equals_the_loop_on_cuda():
    torch.manual_seed(0)
    layer = M.feed_forward(dataclasses.replace(CONFIGS["gpt2-like"], moe=moe.MoEConfig(n_experts=4))).to(CUDA)
    x = torch.randn(64, 64, device=CUDA)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=torch.cuda.is_bf16_supported()):
        layer(x)
        assert layer.routing.probs.dtype == torch.float32
    logits = layer.router_logits(x)
    c = layer.config
    cap = moe.expert_capacity(64, c.n_experts, c.top_k, c.capacity_factor)
    fast = moe.dispatch(x, layer.experts, moe.route(logits, c.top_k, cap))
    slow = moe.moe_reference(x, logits, layer.experts, c.top_k, cap)
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-4)


def test_measure_routing_follows_a_model_on_cuda():
    config = CONFIGS["moe"]
    torch.manual_seed(0)
    gpt = M.GPT(config)
    ids = torch.randint(0, config.vocab_size, (2000,), generator=torch.Generator().manual_seed(0))
    settings = train.TrainConfig(batch_size=4, eval_batches=2)
    on_cpu = moe_runs.measure_routing(gpt, ids, settings)
    on_cuda = moe_runs.measure_routing(gpt.to(CUDA), ids, settings)
    torch.testing.assert_close(on_cuda[0], on_cpu[0], atol=1e-6, rtol=0)
    assert on_cuda[1] == on_cpu[1]


def test_generation_takes_a_cpu_prompt_and_a_cpu_generator_for_a_model_on_cuda():
    config = CONFIGS["llama-like"]
    torch.manual_seed(0)
    cpu_model = M.GPT(config).eval()
    cuda_model = copy.deepcopy(cpu_model).to(CUDA)
    prompt = _batch(config, B=2)[:, :5]  # on the CPU
    for kwargs in [{"greedy": True}, {"temperature": 1.0}, {"top_p": 0.9}]:
        seeded = [dict(kwargs, generator=torch.Generator().manual_seed(3)) for _ in range(2)]
        out = generation.generate(cuda_model, prompt, 12, **seeded[0])
        assert out.device.type == CUDA.type
        # a CPU generator draws on the CPU: the same seed gives the same tokens on either device
        assert torch.equal(out.cpu(), generation.generate(cpu_model, prompt, 12, **seeded[1])), kwargs
    beams = generation.beam_search(cuda_model, prompt[:1], 6, beam_width=3)
    assert torch.equal(beams.cpu(), generation.beam_search(cpu_model, prompt[:1], 6, beam_width=3))


def test_lora_on_cuda_trains_only_the_adapters_and_merges_exactly():
    torch.manual_seed(0)
    gpt = M.GPT(CONFIGS["llama-like"]).to(CUDA)
    lora.apply_lora(gpt, lora.LoRAConfig(rank=4, targets=("attn", "mlp")))
    idx = _batch(CONFIGS["llama-like"]).to(CUDA)
    frozen = {n: p.detach().clone() for n, p in gpt.named_parameters() if not p.requires_grad}
    optimizer = torch.optim.AdamW([p for p in gpt.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(3):
        optimizer.zero_grad()
        gpt(idx, idx)[1].backward()
        optimizer.step()
    assert all(torch.equal(p, frozen[n]) for n, p in gpt.named_parameters() if not p.requires_grad)
    before = gpt.eval()(idx)[0]
    lora.merge_lora(gpt)
    torch.testing.assert_close(gpt(idx)[0], before, atol=1e-4, rtol=1e-4)


def test_training_picks_cuda_and_bf16_by_itself():
    config = CONFIGS["moe"]
    ids = torch.arange(3000) % 11  # a periodic text: the loss must fall fast
    settings = train.TrainConfig(max_steps=60, warmup_steps=5, lr=3e-3, batch_size=8, eval_every=60,
                                 eval_batches=2)  # device and precision "auto"
    gpt = M.GPT(config)
    history = train.train(gpt, ids, ids, settings, progress=False)
    assert next(gpt.parameters()).device.type == "cuda"
    assert history.val_loss[-1] < 0.5 * history.val_loss[0]


def test_rl_and_dpo_run_on_cuda():
    task = rlhf.PreferenceTask()
    config = M.ModelConfig(vocab_size=256, context_length=32, d_model=32, n_layers=1, n_heads=2)
    torch.manual_seed(0)
    policy = M.GPT(config).to(CUDA)
    ref = rlhf.frozen_copy(policy)
    history = rlhf.train_rl(policy, ref, task.prompts(16), rlhf.verifier(task.score),
                            rlhf.RLConfig(steps=3, group_size=4, prompts_per_step=4, max_new_tokens=8),
                            progress=False)
    assert history["kl"][0] == pytest.approx(0.0, abs=1e-6) and len(history["reward"]) == 3
    settings = train.TrainConfig(max_steps=3, batch_size=8, warmup_steps=1)
    dpo = rlhf.train_dpo(policy, ref, task.pairs(32), settings, progress=False)
    assert all(torch.isfinite(torch.tensor(dpo["loss"])))
