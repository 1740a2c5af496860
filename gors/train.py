"""Stage 4, `gors train`: reward-weighted LoRA fine-tuning on the selected samples.

The order follows diffusers' `train_text_to_image_lora.py`: Accelerator with a project config,
seed, freeze and cast, LoRA, optimizer, `prepare`, save/load hooks that keep only the adapters,
steps gated on `sync_gradients`, checkpoints pruned past a limit, validation, `end_training`.
Checkpoints are saved atomically and resumed only under the settings that made them
(`gors.checkpoints`).
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration, set_seed

from gors.checkpoints import check_resumable, checkpoint_step, find_checkpoint, training_fingerprint, write_checkpoint
from gors.config import RunConfig, TrainConfig
from gors.core.backbones import check_resolution, check_trainable, detect_backbone
from gors.core.distributed import make_accelerator, progress_bar
from gors.core.hub import check_model_path
from gors.core.pipeline import cpu_generators
from gors.core.run_folder import LATENT_CACHE_DIR, samples_dir
from gors.core.store import SampleStore
from gors.lora import add_lora, load_lora, lora_parameters, save_lora
from gors.loss import diffusion_target, reward_weighted_loss
from gors.select import load_selection, reward_statistics
from gors.training_data import BatchSchedule, cached_latent_distributions
from gors.validation import BenchmarkValidation


def training_accelerator(config: TrainConfig | RunConfig) -> Accelerator:
    """The Accelerator of a training run: accumulation, precision, trackers and the run folder."""
    project = ProjectConfiguration(project_dir=config.output_dir, logging_dir=str(Path(config.output_dir) / "logs"))
    return make_accelerator(
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        mixed_precision=config.mixed_precision,
        log_with=None if config.report_to == "none" else config.report_to,
        project_config=project,
    )


def _load_components(config: TrainConfig | RunConfig):
    from diffusers import AutoencoderKL, DDPMScheduler, UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTokenizer

    from gors.core.hub import from_pretrained

    name = check_model_path(config.pretrained_model_name_or_path)

    def load(cls, subfolder: str, **kwargs):
        return from_pretrained(cls.from_pretrained, name, "--pretrained_model_name_or_path", subfolder=subfolder,
                               revision=config.revision, **kwargs)

    # Weights load in fp32 whatever dtype they were saved in (e.g. fp16 checkpoints); the trainer
    # casts the frozen ones to the mixed-precision dtype itself.
    return (
        load(CLIPTokenizer, "tokenizer"),
        load(CLIPTextModel, "text_encoder", dtype=torch.float32),
        load(AutoencoderKL, "vae", dtype=torch.float32),
        load(UNet2DConditionModel, "unet", dtype=torch.float32),
        load(DDPMScheduler, "scheduler"),
    )


class GORSTrainer:
    """Reward-weighted LoRA training on `selection.jsonl` of a run folder."""

    def __init__(self, config: TrainConfig | RunConfig, accelerator: Accelerator | None = None) -> None:
        backbone = detect_backbone(config.pretrained_model_name_or_path, config.revision)
        check_trainable(backbone, config.pretrained_model_name_or_path)  # before any weights load
        self.resolution = check_resolution(backbone, backbone.sampling.resolve(None, None, config.resolution)[2])
        self.config = config
        self.accelerator = accelerator or training_accelerator(config)
        self.output_dir = Path(config.output_dir)

    # ----- set-up -------------------------------------------------------------------------
    def _setup_models(self) -> None:
        config, accelerator = self.config, self.accelerator
        self.tokenizer, self.text_encoder, self.vae, self.unet, self.noise_scheduler = _load_components(config)
        self.weight_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(accelerator.mixed_precision, torch.float32)
        self.vae.requires_grad_(False)
        self.text_encoder.requires_grad_(False)
        self.unet.requires_grad_(False)
        # Frozen weights in the compute dtype; the VAE only encodes once, in fp32 for an exact cache.
        self.vae.to(accelerator.device)
        for module in (self.unet, self.text_encoder):
            module.to(accelerator.device)
            if self.weight_dtype != torch.float32:
                module.to(dtype=self.weight_dtype)
        add_lora(
            self.unet if config.train_unet else None,
            self.text_encoder if config.train_text_encoder else None,
            config.rank,
        )
        trained = [m for m, on in ((self.unet, config.train_unet), (self.text_encoder, config.train_text_encoder)) if on]
        for module in trained:
            for param in lora_parameters(module):
                param.data = param.data.float()  # adapters train in fp32 under mixed precision
        if config.gradient_checkpointing:
            self.unet.enable_gradient_checkpointing()
            self.text_encoder.gradient_checkpointing_enable()

    def _setup_optimizer(self) -> None:
        config = self.config
        groups = []
        if config.train_unet:
            groups.append({"params": lora_parameters(self.unet), "lr": config.learning_rate})
        if config.train_text_encoder:
            groups.append({"params": lora_parameters(self.text_encoder), "lr": config.text_encoder_learning_rate})
        self.optimizer = torch.optim.AdamW(
            groups,
            betas=(config.adam_beta1, config.adam_beta2),
            weight_decay=config.adam_weight_decay,
            eps=config.adam_epsilon,
        )
        from diffusers.optimization import get_scheduler

        # A prepared scheduler steps once per process per update, hence the scaling.
        n = self.accelerator.num_processes
        self.lr_scheduler = get_scheduler(
            config.lr_scheduler,
            optimizer=self.optimizer,
            num_warmup_steps=config.lr_warmup_steps * n,
            num_training_steps=config.max_train_steps * n,
        )

    def _register_hooks(self) -> None:
        unet = self.unet if self.config.train_unet else None
        text_encoder = self.text_encoder if self.config.train_text_encoder else None
        accelerator = self.accelerator

        def save_hook(models: list, weights: list, output_dir: str) -> None:
            if accelerator.is_main_process:
                save_lora(output_dir, unet, text_encoder)
            weights.clear()  # only the adapters are saved, never the frozen base weights

        def load_hook(models: list, input_dir: str) -> None:
            load_lora(input_dir, unet, text_encoder)
            models.clear()

        accelerator.register_save_state_pre_hook(save_hook)
        accelerator.register_load_state_pre_hook(load_hook)

    def _load_data(self) -> None:
        config = self.config
        self.latents = cached_latent_distributions(
            self.selection,
            SampleStore(samples_dir(config.output_dir)),
            self.vae,
            self.accelerator,
            self.output_dir / LATENT_CACHE_DIR,
            self.resolution,
            config.center_crop,
            config.pretrained_model_name_or_path,
        )
        self.vae.to("cpu")  # not needed again during training
        self.input_ids = self.tokenizer(
            [row["prompt"] for row in self.selection],
            padding="max_length",
            max_length=self.tokenizer.model_max_length,
            truncation=True,
            return_tensors="pt",
        ).input_ids
        self.empty_ids = self.tokenizer(
            [""], padding="max_length", max_length=self.tokenizer.model_max_length, return_tensors="pt"
        ).input_ids
        self.rewards = torch.tensor([row["reward"] for row in self.selection], dtype=torch.float32)
        self.schedule = BatchSchedule(
            len(self.selection), config.train_batch_size, self.accelerator.num_processes,
            self.accelerator.process_index, config.seed,
        )

    # ----- one micro-batch ----------------------------------------------------------------
    def _micro_batch_loss(self, micro_batch: int) -> torch.Tensor:
        device = self.accelerator.device
        index = torch.tensor(self.schedule.indices(micro_batch))
        mean = self.latents["mean"][index].to(device)
        std = self.latents["std"][index].to(device)
        if self.config.sample_latents:
            mean = mean + std * torch.randn_like(mean)
        latents = mean * self.vae.config.scaling_factor
        noise = torch.randn_like(latents)
        timesteps = torch.randint(0, self.noise_scheduler.config.num_train_timesteps, (len(index),), device=device)
        noisy = self.noise_scheduler.add_noise(latents, noise, timesteps)
        input_ids = self.input_ids[index]
        if self.config.caption_dropout > 0:
            dropped = torch.rand(len(index)) < self.config.caption_dropout
            input_ids = torch.where(dropped[:, None], self.empty_ids, input_ids)
        encoder_hidden_states = self.text_encoder(input_ids.to(device), return_dict=False)[0]
        model_pred = self.unet(
            noisy.to(self.weight_dtype), timesteps, encoder_hidden_states.to(self.weight_dtype), return_dict=False
        )[0]
        target = diffusion_target(self.noise_scheduler, latents, noise, timesteps)
        return reward_weighted_loss(model_pred, target, self.rewards[index].to(device))

    # ----- logging --------------------------------------------------------------------------
    def _tensorboard(self):
        for tracker in self.accelerator.trackers:
            if tracker.name == "tensorboard":
                return tracker.writer
        return None

    def _log_selection(self) -> None:
        values = self.rewards.tolist()
        stats = reward_statistics(values)
        self.accelerator.log({f"selected/reward_{k}": v for k, v in stats.items()}, step=0)
        writer = self._tensorboard()
        if writer is not None:
            writer.add_histogram("selected/reward", np.asarray(values), 0)

    def _pipeline(self):
        """A DDIM pipeline over the models being trained (the VAE moved to the device while it is used)."""
        from diffusers import DDIMScheduler, StableDiffusionPipeline

        pipeline = StableDiffusionPipeline(
            vae=self.vae.to(self.accelerator.device),
            text_encoder=self.accelerator.unwrap_model(self.text_encoder),
            tokenizer=self.tokenizer,
            unet=self.accelerator.unwrap_model(self.unet),
            scheduler=DDIMScheduler.from_config(self.noise_scheduler.config),
            safety_checker=None,
            feature_extractor=None,
            requires_safety_checker=False,
        )
        pipeline.set_progress_bar_config(disable=True)
        return pipeline

    def _save_lora(self, directory: Path) -> Path:
        unwrap = self.accelerator.unwrap_model
        return save_lora(
            directory,
            unwrap(self.unet) if self.config.train_unet else None,
            unwrap(self.text_encoder) if self.config.train_text_encoder else None,
        )

    @torch.no_grad()
    def validate_on_benchmark(self, step: int) -> dict:
        """`--validation_benchmark` with the current LoRA, on every process; see `gors.validation`."""
        modes = {module: module.training for module in (self.unet, self.text_encoder)}
        for module in modes:
            module.eval()
        summary = self.validation.run(step, self._pipeline(), self._save_lora)
        self.vae.to("cpu")
        for module, training in modes.items():
            module.train(training)
        return summary

    @torch.no_grad()
    def log_validation(self, step: int) -> list:
        """Render `--validation_prompts` with the current LoRA (own generators: the training RNG is untouched)."""
        config = self.config
        pipeline = self._pipeline()
        prompts = list(config.validation_prompts or [])
        images = pipeline(
            prompt=prompts,
            height=self.resolution,
            width=self.resolution,
            num_inference_steps=30,
            guidance_scale=7.5,
            generator=cpu_generators([config.seed + i for i in range(len(prompts))]),
        ).images
        self.vae.to("cpu")
        writer = self._tensorboard()
        if writer is not None:
            writer.add_images("validation", np.stack([np.asarray(im) for im in images]), step, dataformats="NHWC")
            for prompt in prompts:
                writer.add_text("validation/prompts", prompt, step)
        return images

    # ----- the loop ---------------------------------------------------------------------------
    def train(self) -> Path:
        """Train to `max_train_steps`, resuming if asked; returns the path of the saved LoRA."""
        config, accelerator = self.config, self.accelerator
        set_seed(config.seed, device_specific=True)
        self.selection = load_selection(config.output_dir)  # fail before loading any model
        self.fingerprint = training_fingerprint(config, self.selection, accelerator.num_processes)
        checkpoint = self._checkpoint_to_resume()  # a refused resume, too, fails before loading any model
        self.validation = BenchmarkValidation(config, accelerator) if config.validation_benchmark else None
        self._setup_models()
        self._setup_optimizer()
        self._register_hooks()
        self._load_data()

        trained = []
        if config.train_unet:
            trained.append("unet")
        if config.train_text_encoder:
            trained.append("text_encoder")
        prepared = accelerator.prepare(*[getattr(self, n) for n in trained], self.optimizer, self.lr_scheduler)
        for name, module in zip(trained, prepared):
            setattr(self, name, module)
        self.optimizer, self.lr_scheduler = prepared[-2:]
        models = [getattr(self, n) for n in trained]

        global_step = 0
        if checkpoint is not None:
            accelerator.load_state(str(checkpoint))
            global_step = checkpoint_step(checkpoint)
            accelerator.print(f"[train] resumed from {checkpoint} at step {global_step}")
            if global_step == config.max_train_steps:
                accelerator.print(f"[train] the checkpoint is at --max_train_steps={global_step}: nothing to train; "
                                  "saving its LoRA")

        if self.validation is not None:
            self.validation.start(resumed=global_step > 0)
        if accelerator.is_main_process:
            tracker_config = {k: v for k, v in asdict(config).items() if isinstance(v, (int, float, str, bool))}
            accelerator.init_trackers("gors", config=tracker_config)
        if global_step == 0:
            self._log_selection()
        accelerator.print(
            f"[train] {len(self.selection)} selected samples, {config.max_train_steps} steps of "
            f"{config.train_batch_size} x {accelerator.num_processes} x {config.gradient_accumulation_steps}"
        )

        params = [p for m in models for p in m.parameters() if p.requires_grad]
        accumulation = config.gradient_accumulation_steps
        bar = progress_bar(config.max_train_steps, accelerator, "train")
        bar.update(global_step)
        for module in models:
            module.train()
        while global_step < config.max_train_steps:
            losses = []
            for micro in range(accumulation):
                with accelerator.accumulate(*models):
                    loss = self._micro_batch_loss(global_step * accumulation + micro)
                    accelerator.backward(loss)
                    if accelerator.sync_gradients:
                        accelerator.clip_grad_norm_(params, config.max_grad_norm)
                    self.optimizer.step()
                    self.lr_scheduler.step()
                    self.optimizer.zero_grad(set_to_none=True)
                losses.append(loss.detach())
            if not accelerator.sync_gradients:
                raise RuntimeError("gradient accumulation went out of step with the update count")
            global_step += 1
            bar.update(1)
            mean_loss = accelerator.gather(torch.stack(losses).mean()[None]).mean().item()
            lrs = self.lr_scheduler.get_last_lr()
            logs = {"train/loss": mean_loss}
            logs |= {f"train/lr_{name}": lr for name, lr in zip(trained, lrs)}
            accelerator.log(logs, step=global_step)
            bar.set_postfix(loss=f"{mean_loss:.4f}")

            if global_step % config.checkpointing_steps == 0 or global_step == config.max_train_steps:
                self.save_checkpoint(global_step)
            if global_step % config.validation_steps == 0:
                if config.validation_prompts and accelerator.is_main_process:
                    self.log_validation(global_step)
                if self.validation is not None:
                    self.validate_on_benchmark(global_step)
                accelerator.wait_for_everyone()
        bar.close()

        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            path = self._save_lora(self.output_dir)
            accelerator.print(f"[train] LoRA saved to {path}")
        # Trackers close here; the process group stays up for whatever the caller runs next
        # (e.g. an evaluation), and the entry point calls `accelerator.end_training()` last.
        for tracker in accelerator.trackers:
            tracker.finish()
        accelerator.trackers.clear()
        return self.output_dir / "pytorch_lora_weights.safetensors"

    def _checkpoint_to_resume(self) -> Path | None:
        """The checkpoint that `--resume_from_checkpoint` names, checked against this run; None to start at 0."""
        config, accelerator = self.config, self.accelerator
        if not config.resume_from_checkpoint:
            return None
        checkpoint = find_checkpoint(config.output_dir, config.resume_from_checkpoint,
                                     warn=lambda message: accelerator.print(f"[train] warning: {message}"))
        if checkpoint is None:
            accelerator.print("[train] no checkpoint to resume from; starting at step 0")
        else:
            check_resumable(checkpoint, self.fingerprint, config.max_train_steps)
        return checkpoint

    def save_checkpoint(self, step: int) -> Path:
        """Full training state (adapters, optimizer, LR scheduler, RNG) at `checkpoints/checkpoint-<step>`."""
        return write_checkpoint(self.accelerator, self.output_dir, step, self.fingerprint,
                                self.config.checkpoints_total_limit)


def train(config: TrainConfig | RunConfig, accelerator: Accelerator | None = None) -> Path:
    """Run GORS training for a run folder that has `selection.jsonl`; returns the LoRA file."""
    return GORSTrainer(config, accelerator).train()
