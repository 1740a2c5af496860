"""`gors toy pretrain`: train the toy model (and the toy classifier reward) from scratch on renders.

Stages, each drawing from its own generator seeded with `seed` (so changing one stage's steps
leaves the next stage's random stream as it was), all reproducible by seed and thread count on
the same hardware:

1. the VAE learns to reconstruct rendered scenes (64 x 64 pixels <-> 8 x 8 x 4 latents);
2. the U-Net and the text encoder learn text-to-image on rendered scenes of every two-object
   prompt and single object, with loosely aligned captions, the toy analogue of web captions:
   the two colours swapped with probability `caption_swap_rate`, the relation word replaced by
   another with probability `relation_noise_rate`, and 10% empty captions for classifier-free
   guidance;
3. the small CNN behind the `toy_classifier` reward learns which colour-shape pairs are present.

Like Stable Diffusion's web data, pretraining has seen every composition, the held-out ones too,
under noisy captions; what is held out is the GORS training prompts, which never contain the
held-out colour-shape combinations (as T2I-CompBench's unseen split is unseen by GORS only).
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from tqdm.auto import tqdm

from gors.config import SEED_LIMIT, check_values
from gors.core.io import atomic_write_json, make_folder, publish_folder, read_json, recover_folder
from gors.core.threads import torch_threads
from gors.core.toy import PRETRAINED_DIR
from gors.core.toy.world import (
    IMAGE_SIZE,
    RELATIONS,
    ToyObject,
    ToyPrompt,
    all_objects,
    render,
    sample_scene,
    split_prompts,
)

if TYPE_CHECKING:
    from diffusers import AutoencoderKL, DDPMScheduler

PREDICTION_TYPES = ("epsilon", "v_prediction")


@dataclass
class ToyPretrainConfig:
    """`gors toy pretrain` settings. The defaults with `--vae gors/core/toy/pretrained/pipeline/vae`
    made the packaged model (README, "The toy world")."""

    output_dir: str = field(
        default="toy_model",
        metadata={"help": "Where the pipeline and classifier go; the folder is replaced whole when all is trained "
                          "(a stopped run leaves it as it was). Not the packaged model's folder unless you mean to "
                          f"replace it ({PRETRAINED_DIR})."},
    )
    seed: int = field(default=0, metadata={"help": "Seed of data, initialisation and training."})
    vae: str | None = field(
        default=None,
        metadata={"help": "A trained toy VAE to keep (a toy pipeline's vae folder, e.g. the packaged "
                          "gors/core/toy/pretrained/pipeline/vae): stage 1 is skipped and the U-Net learns its latents."},
    )
    num_scenes: int = field(default=10000, metadata={"help": "Rendered training scenes (encoded once)."})
    vae_steps: int = field(default=800, metadata={"help": "VAE training steps (batch 32)."})
    unet_steps: int = field(default=6000, metadata={"help": "U-Net + text-encoder steps."})
    batch_size: int = field(default=64, metadata={"help": "U-Net batch size."})
    learning_rate: float = field(default=1e-3, metadata={"help": "U-Net + text-encoder AdamW learning rate."})
    caption_swap_rate: float = field(
        default=0.3, metadata={"help": "Chance that a two-object caption names the two colours the wrong way round."}
    )
    relation_noise_rate: float = field(
        default=0.1, metadata={"help": "Chance that a caption's relation word is replaced by another relation."}
    )
    classifier_steps: int = field(default=1500, metadata={"help": "Toy classifier training steps."})
    unet_channels: list[int] = field(
        default_factory=lambda: [32, 64],
        metadata={"help": "U-Net channels, one cross-attention block each; every block but the last halves the "
                          "8 x 8 latent grid (32 64: down to 4 x 4; 32 64 64: down to 2 x 2)."},
    )
    prediction_type: str = field(
        default="v_prediction",
        metadata={"help": "What the U-Net learns to predict: 'v_prediction' (the packaged model; its targets carry "
                          "the layout at the high noise levels where sampling decides it) or 'epsilon'."},
    )
    num_threads: int = field(
        default=1,
        metadata={"help": "Torch CPU threads. The trained model depends on it (it sets the order of summation, and "
                          "whether the toy U-Net learns the relation depends on such details), so the default fixes it."},
    )
    token_embedding_std: float | None = field(
        default=1.0,
        metadata={"help": "Re-initialise the text encoder's token embeddings from N(0, std), which separates the "
                          "relation words from the start (null in a --config YAML: CLIP's own initialisation, std 0.02)."},
    )

    def __post_init__(self) -> None:
        check_values(self)  # each field's type and choices, as the flags are checked
        if not str(self.output_dir).strip():
            raise ValueError("--output_dir='': give the folder the toy model goes to, e.g. toy_model")
        self.output_dir = os.path.expanduser(self.output_dir)  # `~` from a quoted flag, as a shell would
        if self.prediction_type not in PREDICTION_TYPES:
            raise ValueError(f"--prediction_type {self.prediction_type!r}: choose one of {', '.join(PREDICTION_TYPES)}")
        if not 1 <= len(self.unet_channels) <= 4 or any(c <= 0 or c % 16 for c in self.unet_channels):
            raise ValueError(f"--unet_channels {self.unet_channels}: give 1 to 4 positive multiples of 16 "
                             "(the U-Net's group norm has 16 groups; 4 blocks take the 8 x 8 grid to 1 x 1)")
        if self.vae is not None:
            example = f"give the vae folder of a toy pipeline, e.g. {PRETRAINED_DIR / 'pipeline' / 'vae'}"
            if not (Path(self.vae) / "config.json").is_file():
                raise ValueError(f"--vae {self.vae}: no config.json there; {example}")
            model_config = read_json(Path(self.vae) / "config.json", "a model's config.json")
            kind = model_config.get("_class_name") if isinstance(model_config, dict) else None
            if kind != "AutoencoderKL":
                raise ValueError(f"--vae {self.vae}: its config.json is of a {kind}, not a VAE (AutoencoderKL); {example}")
        elif self.vae_steps == 0:
            raise ValueError("--vae_steps 0 without --vae would keep an untrained VAE: give >= 1 steps, or --vae")
        if not 0 <= self.seed < SEED_LIMIT:  # numpy's generators take no negative seed
            raise ValueError(f"--seed {self.seed}: must be in [0, {SEED_LIMIT - 1}]")
        if self.num_threads < 1:
            raise ValueError(f"--num_threads {self.num_threads}: must be >= 1")
        if Path(self.output_dir).exists() and not Path(self.output_dir).is_dir():
            raise ValueError(f"--output_dir={self.output_dir!r} is a file, not a folder; pass a folder path")
        for name in ("num_scenes", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name} {getattr(self, name)}: must be >= 1")
        if self.vae_steps < 0:  # 0 with --vae, whose VAE is taken as it is
            raise ValueError(f"--vae_steps {self.vae_steps}: must be >= 0")
        for name in ("unet_steps", "classifier_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name} {getattr(self, name)}: must be >= 1")
        if not self.learning_rate > 0:
            raise ValueError(f"--learning_rate {self.learning_rate}: must be > 0")
        for name in ("caption_swap_rate", "relation_noise_rate"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"--{name} {getattr(self, name)}: a rate, in [0, 1]")
        if self.token_embedding_std is not None and not self.token_embedding_std > 0:
            raise ValueError(f"--token_embedding_std {self.token_embedding_std}: must be > 0 (or null in a --config YAML)")



def loads_in_float32(folder: Path) -> None:
    """Let transformers load a text encoder saved in half precision (to keep the package small) in float32,
    as diffusers loads the U-Net and VAE beside it: transformers takes the dtype its config records, and a
    float16 encoder before a float32 U-Net fails in a plain `StableDiffusionPipeline.from_pretrained`."""
    config = read_json(folder / "config.json", "the text encoder's config")
    atomic_write_json(folder / "config.json", {**config, "dtype": "float32"})

def swapped_colours(prompt: ToyPrompt) -> ToyPrompt:
    """`prompt` with its two colours exchanged: the caption of an image drawn with the binding wrong."""
    a, b = prompt.objects
    return ToyPrompt((ToyObject(b.colour, a.shape), ToyObject(a.colour, b.shape)), prompt.relation)


def noisy_caption(prompt: ToyPrompt, swap_rate: float, relation_noise_rate: float,
                  rng: np.random.Generator) -> ToyPrompt:
    """The caption a scene of `prompt` gets: colours swapped and/or relation replaced at the given rates."""
    caption = prompt
    if len(prompt.objects) == 2 and rng.random() < swap_rate:
        caption = swapped_colours(caption)
    if caption.relation is not None and rng.random() < relation_noise_rate:
        others = [r for r in RELATIONS if r != caption.relation]
        caption = ToyPrompt(caption.objects, others[rng.integers(len(others))])
    return caption


def pretraining_corpus(num_scenes: int, swap_rate: float, relation_noise_rate: float,
                       rng: np.random.Generator) -> tuple[list, list[str]]:
    """Rendered scenes with loosely aligned captions: 80% two-object scenes of all two-object
    prompts (train and held-out), 20% single objects of all twelve colour-shape combinations."""
    train, held_out = split_prompts()
    compositions = train + held_out
    singles = [ToyPrompt((o,)) for o in all_objects()]
    images, captions = [], []
    for _ in range(num_scenes):
        if rng.random() < 0.2:
            prompt = singles[rng.integers(len(singles))]
        else:
            prompt = compositions[rng.integers(len(compositions))]
        images.append(np.asarray(render(sample_scene(prompt, rng))))
        captions.append(noisy_caption(prompt, swap_rate, relation_noise_rate, rng).text)
    return images, captions


def _to_tensor(images: list[np.ndarray]) -> torch.Tensor:
    return torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).float() / 127.5 - 1.0


def train_vae(vae: AutoencoderKL, pixels: torch.Tensor, steps: int, generator: torch.Generator) -> float:
    """Reconstruction (MSE) plus a light KL term; returns the latent scaling factor 1 / std."""
    optimizer = torch.optim.AdamW(vae.parameters(), lr=1e-3)
    vae.train()
    for _ in tqdm(range(steps), desc="pretrain VAE"):
        batch = pixels[torch.randint(len(pixels), (32,), generator=generator)]
        posterior = vae.encode(batch).latent_dist
        reconstruction = vae.decode(posterior.sample(generator)).sample
        loss = torch.nn.functional.mse_loss(reconstruction, batch) + 1e-6 * posterior.kl().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    vae.eval()
    return float(1.0 / _latent_means(vae, pixels[:2048]).std())


@torch.no_grad()
def _latent_means(vae, pixels: torch.Tensor) -> torch.Tensor:
    return torch.cat([vae.encode(pixels[i : i + 256]).latent_dist.mean for i in range(0, len(pixels), 256)])


def encode_corpus(vae: AutoencoderKL, pixels: torch.Tensor, scaling_factor: float) -> torch.Tensor:
    """The scaled latent means of `pixels` (N, 3, H, W in [-1, 1]): what the U-Net pretrains on."""
    return _latent_means(vae, pixels) * scaling_factor


def train_text_to_image(components: dict, latents: torch.Tensor, captions: list[str], config: ToyPretrainConfig,
                        generator: torch.Generator) -> None:
    """Denoising training of U-Net and text encoder from scratch.

    The target is the noise or the velocity, as `components["noise_scheduler"]`'s
    ``prediction_type`` says (`set_prediction_type`).
    """
    unet, text_encoder, tokenizer = components["unet"], components["text_encoder"], components["tokenizer"]
    scheduler = components["noise_scheduler"]
    ids = tokenizer(captions, padding="max_length", max_length=tokenizer.model_max_length, return_tensors="pt").input_ids
    empty = tokenizer([""], padding="max_length", max_length=tokenizer.model_max_length, return_tensors="pt").input_ids
    params = list(unet.parameters()) + list(text_encoder.parameters())
    optimizer = torch.optim.AdamW(params, lr=config.learning_rate, weight_decay=1e-2)
    lr_schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, config.learning_rate, total_steps=config.unet_steps,
                                                      pct_start=0.05)
    unet.train()
    text_encoder.train()
    bar = tqdm(range(config.unet_steps), desc="pretrain U-Net + text encoder")
    for _ in bar:
        index = torch.randint(len(latents), (config.batch_size,), generator=generator)
        batch_ids = ids[index].clone()
        drop = torch.rand(config.batch_size, generator=generator) < 0.1
        batch_ids[drop] = empty
        x0 = latents[index]
        noise = torch.randn(x0.shape, generator=generator)
        t = torch.randint(0, scheduler.config.num_train_timesteps, (config.batch_size,), generator=generator)
        prediction = unet(scheduler.add_noise(x0, noise, t), t, text_encoder(batch_ids)[0]).sample
        loss = torch.nn.functional.mse_loss(prediction, denoising_target(scheduler, x0, noise, t))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        lr_schedule.step()
        optimizer.zero_grad(set_to_none=True)
        bar.set_postfix(loss=f"{loss.item():.4f}")
    unet.eval()
    text_encoder.eval()


def denoising_target(scheduler: DDPMScheduler, x0: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """What the U-Net should predict for `x0` noised with `noise` at timesteps `t`."""
    if scheduler.config.prediction_type == "v_prediction":
        return scheduler.get_velocity(x0, noise, t)
    return noise


def load_toy_vae(path: str, unet: torch.nn.Module) -> torch.nn.Module:
    """The `AutoencoderKL` in `path` (fp32, eval mode), checked to make the latents `unet` denoises."""
    from diffusers import AutoencoderKL

    vae = AutoencoderKL.from_pretrained(path, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        shape = tuple(vae.encode(torch.zeros(1, 3, IMAGE_SIZE, IMAGE_SIZE)).latent_dist.mean.shape[1:])
    wanted = (unet.config.in_channels, unet.config.sample_size, unet.config.sample_size)
    if shape != wanted:
        raise ValueError(f"--vae {path}: encodes {IMAGE_SIZE} x {IMAGE_SIZE} scenes to latents {shape}, the toy U-Net denoises {wanted}; "
                         "give a toy pipeline's vae folder")
    return vae


def set_prediction_type(components: dict, prediction_type: str) -> None:
    """Train (noise scheduler) and sample (pipeline scheduler) with the same `prediction_type`."""
    for key in ("noise_scheduler", "scheduler"):
        components[key].register_to_config(prediction_type=prediction_type)


def pretrain(config: ToyPretrainConfig) -> Path:
    """Train everything and save the pipeline (fp16 weights) and the classifier into `output_dir`,
    on `config.num_threads` torch threads (the caller's count is restored afterwards)."""
    with torch_threads(config.num_threads):
        return _pretrain(config)


def _pretrain(config: ToyPretrainConfig) -> Path:
    from diffusers import StableDiffusionPipeline

    from gors.toy.model import build_toy_components
    from rewards.toy_cnn import train_classifier

    start = time.time()
    torch.manual_seed(config.seed)
    rng = np.random.default_rng(config.seed)
    final = Path(config.output_dir).resolve()
    recover_folder(final)
    if final.is_dir() and any(final.iterdir()) and not (final / "pretrain_info.json").is_file():
        raise ValueError(f"--output_dir={config.output_dir!r} holds files that are not a toy model; the trained model "
                         "replaces the folder whole, so give a new or empty folder (or a toy model's to replace)")
    # Built beside and published whole: a stopped run leaves the folder (perhaps the packaged model) as it was.
    output_dir = final.with_name(f".{final.name}.pretraining")
    shutil.rmtree(output_dir, ignore_errors=True)
    make_folder(output_dir, "--output_dir")
    components = build_toy_components(output_dir / "_work", seed=config.seed, unet_channels=config.unet_channels)
    set_prediction_type(components, config.prediction_type)
    if config.token_embedding_std is not None:
        embedding = components["text_encoder"].embeddings.token_embedding.weight
        with torch.no_grad():
            embedding.normal_(0.0, config.token_embedding_std, generator=torch.Generator().manual_seed(config.seed + 1))
    images, captions = pretraining_corpus(config.num_scenes, config.caption_swap_rate, config.relation_noise_rate, rng)
    pixels = _to_tensor(images)
    timings = {}
    if config.vae is None:
        scaling_factor = train_vae(components["vae"], pixels, config.vae_steps, torch.Generator().manual_seed(config.seed))
        components["vae"].register_to_config(scaling_factor=scaling_factor)
    else:
        components["vae"] = load_toy_vae(config.vae, components["unet"])
    timings["vae_s"] = time.time() - start
    latents = encode_corpus(components["vae"], pixels, components["vae"].config.scaling_factor)
    train_text_to_image(components, latents, captions, config, torch.Generator().manual_seed(config.seed))
    timings["unet_s"] = time.time() - start - timings["vae_s"]

    pipeline = StableDiffusionPipeline(
        vae=components["vae"], text_encoder=components["text_encoder"], tokenizer=components["tokenizer"],
        unet=components["unet"], scheduler=components["scheduler"], safety_checker=None, feature_extractor=None,
        requires_safety_checker=False,
    )
    pipeline.to(torch.float16).save_pretrained(output_dir / "pipeline")
    loads_in_float32(output_dir / "pipeline" / "text_encoder")
    classifier = train_classifier(steps=config.classifier_steps, seed=config.seed)
    classifier.save_pretrained(output_dir / "classifier")
    timings["classifier_s"] = time.time() - start - timings["vae_s"] - timings["unet_s"]
    for leftover in sorted((output_dir / "_work").rglob("*"), reverse=True):
        leftover.unlink() if leftover.is_file() else leftover.rmdir()
    (output_dir / "_work").rmdir()
    settings = {k: v for k, v in asdict(config).items() if k != "output_dir"}
    info = {"config": settings, "seconds": {k: round(v, 1) for k, v in timings.items()},
            "total_seconds": round(time.time() - start, 1), "torch_threads": torch.get_num_threads()}
    atomic_write_json(output_dir / "pretrain_info.json", info)
    publish_folder(output_dir, final)
    return final


def pretrain_and_report(config: ToyPretrainConfig) -> None:
    """`gors toy pretrain`: train everything, then say where it went."""
    print(f"[toy pretrain] wrote {pretrain(config)}")
