#!/usr/bin/env python3
"""Workloads made from openb's default pod list, in the spirit of the FGD
paper's other openb workloads (which are not these): fewer or more CPU-only
pods, GPU pods that all share a GPU, multi-GPU pods holding half the GPUs
asked for, a third of the GPU pods bound to one GPU model.

    scripts/openb-variants.py POD_LIST.csv NODE_LIST.csv OUT_DIR

writes OUT_DIR/{cpu050,cpu250,gpushare100,multigpu50,gpuspec33}.csv in the
pod list's own format, for scripts/openb-bench.sh. Seeded: the same input
gives the same files.
"""
import csv
import random
import sys


def kind(pod):
    gpus, milli = int(pod["num_gpu"]), int(pod["gpu_milli"])
    if gpus == 0:
        return "cpu"
    if gpus == 1:
        return "share" if milli < 1000 else "one"
    return "multi"


def gpus_asked(pod):
    return int(pod["gpu_milli"]) / 1000 if int(pod["num_gpu"]) == 1 else int(pod["num_gpu"])


def write(path, header, pods, prefix):
    with open(path, "w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=header)
        writer.writeheader()
        for number, pod in enumerate(pods):
            writer.writerow({**pod, "name": f"{prefix}-{number}"})


def main(pod_list, node_list, out_dir):
    pods = list(csv.DictReader(open(pod_list)))
    header = list(pods[0].keys())
    models = [node["model"] for node in csv.DictReader(open(node_list))]
    by_kind = {name: [pod for pod in pods if kind(pod) == name] for name in ("cpu", "share", "one", "multi")}
    gpu_pods = [pod for pod in pods if kind(pod) != "cpu"]
    rng = random.Random(7)
    variants = {}
    # CPU-only pods: half as many, and two and a half times as many.
    variants["cpu050"] = gpu_pods + rng.sample(by_kind["cpu"], len(by_kind["cpu"]) // 2)
    extra = int(len(by_kind["cpu"]) * 1.5)
    variants["cpu250"] = pods + [rng.choice(by_kind["cpu"]) for _ in range(extra)]
    # Every GPU pod a share of one GPU, as many GPU pods as before.
    variants["gpushare100"] = by_kind["cpu"] + [rng.choice(by_kind["share"]) for _ in gpu_pods]
    # Multi-GPU pods asking as many GPUs as all the others together.
    others = [pod for pod in gpu_pods if kind(pod) != "multi"]
    target, multi = sum(gpus_asked(pod) for pod in others), []
    while sum(gpus_asked(pod) for pod in multi) < target:
        multi.append(rng.choice(by_kind["multi"]))
    variants["multigpu50"] = by_kind["cpu"] + others + multi
    # A third of the GPU pods bound to the model of a node drawn at random.
    variants["gpuspec33"] = [
        {**pod, "gpu_spec": rng.choice(models)} if kind(pod) != "cpu" and rng.random() < 0.33 else pod
        for pod in pods
    ]
    for name, variant in variants.items():
        write(f"{out_dir}/{name}.csv", header, variant, name)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
