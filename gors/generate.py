"""Stage 1, `gors generate`: k images per training prompt into the sample store."""

from __future__ import annotations

import os

from accelerate import Accelerator

from evaluators.toy import ToyBenchmark
from gors.config import GenerateConfig, RunConfig
from gors.core.backbones import check_resolution, detect_backbone, family_precision
from gors.core.distributed import make_accelerator
from gors.core.lock import holds_stages
from gors.core.pipeline import check_lora_path, inference_dtype, load_pipeline, pipeline_settings
from gors.core.prompts import TOY_CATEGORY, load_prompts
from gors.core.run_folder import samples_dir
from gors.core.sampling import SampleSink, SamplingProtocol, generate_samples
from gors.core.store import SampleStore


@holds_stages("generate")
def generate(config: GenerateConfig | RunConfig, accelerator: Accelerator | None = None, lora: str | None = None,
             seed: int | None = None, sink: SampleSink | None = None) -> SampleStore:
    """Stage 1: `config.images_per_prompt` images per training prompt into `<output_dir>/samples`.

    `lora`: a folder whose LoRA the pipeline loads (online rounds: the previous round's); the store
    records it relative to `output_dir`, so that a run folder still resumes after it is moved. `seed`:
    the base seed of the images instead of `config.seed` (online rounds: the round's). `sink` gets each
    batch as it lands in the store (`gors run --overlap_scoring`: the reward scores it meanwhile).
    """
    if lora is not None:
        check_lora_path(lora)  # before the store records settings or anything loads
    accelerator = accelerator or make_accelerator()
    prompt_set = load_prompts(config.train_prompts)
    prompts = prompt_set.prompts[: config.max_prompts]
    backbone = detect_backbone(config.pretrained_model_name_or_path, config.revision)  # no weights yet
    # The family's sampling where not given; the toy world's prompts on a Stable Diffusion model (the
    # packaged toy model's family) sample as the toy benchmark does, 20 steps at 4.0 and 64 px.
    sampling = ToyBenchmark.official_sampling if prompt_set.category == TOY_CATEGORY and backbone.name == "sd" \
        else backbone.sampling
    steps, guidance, resolution = sampling.resolve(config.num_inference_steps, config.guidance_scale,
                                                   config.resolution)
    protocol = SamplingProtocol(
        images_per_prompt=config.images_per_prompt,
        num_inference_steps=steps,
        guidance_scale=guidance,
        resolution=check_resolution(backbone, resolution),
        batch_size=config.generation_batch_size,
        seed=config.seed if seed is None else seed,
        call_kwargs=backbone.call_kwargs,
    )

    dtype = inference_dtype(accelerator, family_precision(backbone, config.mixed_precision))

    def loader():
        return load_pipeline(config.pretrained_model_name_or_path, accelerator.device, dtype, config.revision,
                             lora=lora, backbone=backbone, torch_compile=config.torch_compile)

    return generate_samples(
        SampleStore(samples_dir(config.output_dir)),
        prompts,
        protocol,
        loader,
        accelerator,
        prompt_info=prompt_set.info(config.max_prompts),
        record_extras={"model": config.pretrained_model_name_or_path},
        settings=pipeline_settings(config.pretrained_model_name_or_path, dtype, config.revision, lora=lora,
                                   backbone=backbone,
                                   recorded_lora=lora and os.path.relpath(lora, config.output_dir)),
        sink=sink,
    )
