"""A YOLO-like detector in plain torch, in two sizes (``n``: width 0.25, ``s``: width 0.50, depth 0.33),
built like YOLOv8: CSP-style backbone (Conv-BN-SiLU, C2f blocks, SPPF), PAN neck, decoupled anchor-free
head with a distribution-focal box branch (``reg_max`` 16) at strides 8/16/32, 80 classes. About 3.2 M
(n) and 11.2 M (s) parameters.

The training step includes the real loss, written so its memory is visible to fake tensors: a dense
task-aligned assigner over ``[B, max_obj, A]`` (A = anchors, 8400 at 640), classification BCE, CIoU and
DFL box losses. Ultralytics' loss indexes with boolean masks (data-dependent shapes); here every
tensor has a fixed shape and masks multiply instead, which is the same memory envelope Ultralytics adds
to its AutoBatch probe (``B·A·6·(max_obj + 2·nc)·4`` bytes, :func:`ultralytics_loss_envelope_bytes`).
Targets are padded to ``max_obj`` boxes per image, as Ultralytics pads a batch to its densest image.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

NUM_CLASSES = 80
REG_MAX = 16
STRIDES = (8, 16, 32)
MAX_OBJ = 100
"""boxes per image the targets are padded to (COCO images hold up to ~90 boxes)"""
SIZES = {"n": (0.33, 0.25), "s": (0.33, 0.50)}
"""size -> (depth multiple, width multiple), as YOLOv8 n/s"""


class Conv(nn.Module):
    """Conv2d (no bias) + BatchNorm + SiLU."""

    def __init__(self, c_in: int, c_out: int, k: int = 1, s: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, k, s, k // 2, bias=False)
        self.bn = nn.BatchNorm2d(c_out, eps=1e-3, momentum=0.03)
        self.act = nn.SiLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


class Bottleneck(nn.Module):
    def __init__(self, c: int, shortcut: bool) -> None:
        super().__init__()
        self.cv1, self.cv2 = Conv(c, c, 3), Conv(c, c, 3)
        self.add = shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class C2f(nn.Module):
    """CSP bottleneck with two convolutions (YOLOv8's C2f)."""

    def __init__(self, c_in: int, c_out: int, n: int, shortcut: bool) -> None:
        super().__init__()
        self.c = c_out // 2
        self.cv1 = Conv(c_in, 2 * self.c, 1)
        self.cv2 = Conv((2 + n) * self.c, c_out, 1)
        self.m = nn.ModuleList(Bottleneck(self.c, shortcut) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = list(self.cv1(x).chunk(2, 1))
        for m in self.m:
            y.append(m(y[-1]))
        return self.cv2(torch.cat(y, 1))


class SPPF(nn.Module):
    def __init__(self, c_in: int, c_out: int, k: int = 5) -> None:
        super().__init__()
        self.cv1 = Conv(c_in, c_in // 2, 1)
        self.cv2 = Conv(c_in // 2 * 4, c_out, 1)
        self.pool = nn.MaxPool2d(k, 1, k // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = [self.cv1(x)]
        for _ in range(3):
            y.append(self.pool(y[-1]))
        return self.cv2(torch.cat(y, 1))


class Detect(nn.Module):
    def __init__(self, nc: int, channels: tuple[int, ...]) -> None:
        super().__init__()
        c2 = max(16, channels[0] // 4, REG_MAX * 4)
        c3 = max(channels[0], min(nc, 100))
        self.cv2 = nn.ModuleList(
            nn.Sequential(Conv(c, c2, 3), Conv(c2, c2, 3), nn.Conv2d(c2, 4 * REG_MAX, 1)) for c in channels
        )
        self.cv3 = nn.ModuleList(
            nn.Sequential(Conv(c, c3, 3), Conv(c3, c3, 3), nn.Conv2d(c3, nc, 1)) for c in channels
        )

    def forward(self, feats: list[torch.Tensor]) -> list[torch.Tensor]:
        return [torch.cat((b(x), c(x)), 1) for x, b, c in zip(feats, self.cv2, self.cv3, strict=True)]


class YoloDetector(nn.Module):
    def __init__(self, size: str = "n", nc: int = NUM_CLASSES) -> None:
        super().__init__()
        depth, width = SIZES[size]

        def ch(c: int) -> int:
            return max(8, math.ceil(c * width / 8) * 8)

        def n(k: int) -> int:
            return max(round(k * depth), 1)

        self.nc = nc
        self.stem = nn.Sequential(
            Conv(3, ch(64), 3, 2), Conv(ch(64), ch(128), 3, 2), C2f(ch(128), ch(128), n(3), True)
        )
        self.p3 = nn.Sequential(Conv(ch(128), ch(256), 3, 2), C2f(ch(256), ch(256), n(6), True))
        self.p4 = nn.Sequential(Conv(ch(256), ch(512), 3, 2), C2f(ch(512), ch(512), n(6), True))
        self.p5 = nn.Sequential(
            Conv(ch(512), ch(1024), 3, 2), C2f(ch(1024), ch(1024), n(3), True), SPPF(ch(1024), ch(1024))
        )
        self.up = nn.Upsample(scale_factor=2.0, mode="nearest")
        self.top_down4 = C2f(ch(1024) + ch(512), ch(512), n(3), False)
        self.top_down3 = C2f(ch(512) + ch(256), ch(256), n(3), False)
        self.down3 = Conv(ch(256), ch(256), 3, 2)
        self.bottom_up4 = C2f(ch(256) + ch(512), ch(512), n(3), False)
        self.down4 = Conv(ch(512), ch(512), 3, 2)
        self.bottom_up5 = C2f(ch(512) + ch(1024), ch(1024), n(3), False)
        self.detect = Detect(nc, (ch(256), ch(512), ch(1024)))

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        p3 = self.p3(self.stem(x))
        p4 = self.p4(p3)
        p5 = self.p5(p4)
        t4 = self.top_down4(torch.cat((self.up(p5), p4), 1))
        n3 = self.top_down3(torch.cat((self.up(t4), p3), 1))
        n4 = self.bottom_up4(torch.cat((self.down3(n3), t4), 1))
        n5 = self.bottom_up5(torch.cat((self.down4(n4), p5), 1))
        return self.detect([n3, n4, n5])


def make_detection_batch(
    batch: int, imgsz: int, max_obj: int = MAX_OBJ, nc: int = NUM_CLASSES
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Random images and ``max_obj`` random boxes per image: (labels [B,M,1], xyxy pixels [B,M,4], valid [B,M,1])."""
    images = torch.rand(batch, 3, imgsz, imgsz)
    labels = torch.randint(0, nc, (batch, max_obj, 1)).float()
    centres = torch.rand(batch, max_obj, 2) * imgsz
    half_sizes = torch.rand(batch, max_obj, 2) * (imgsz / 8) + 4
    boxes = torch.cat((centres - half_sizes, centres + half_sizes), -1).clamp(0, imgsz)
    return images, (labels, boxes, torch.ones(batch, max_obj, 1))


def ultralytics_loss_envelope_bytes(
    batch: int, imgsz: int, max_obj: int = MAX_OBJ, nc: int = NUM_CLASSES
) -> int:
    """Ultralytics' AutoBatch loss/assigner envelope ``B·A·6·(max_obj + 2·nc)·4`` bytes, A = anchors.

    Source: ``ultralytics/utils/autobatch.py`` (PR #17514), summarised in shared/reference/ultralytics-behaviour.md §6.
    The factor 2 on ``nc`` stands for validation at 2x batch, which a training step does not run.
    """
    anchors = sum((imgsz // s) ** 2 for s in STRIDES)
    return batch * anchors * 6 * (max_obj + 2 * nc) * 4


def _anchors(
    feats: list[torch.Tensor], strides: tuple[int, ...] = STRIDES
) -> tuple[torch.Tensor, torch.Tensor]:
    points, stride_rows = [], []
    for feat, stride in zip(feats, strides, strict=True):
        h, w = feat.shape[2:]
        sy, sx = torch.meshgrid(torch.arange(h) + 0.5, torch.arange(w) + 0.5, indexing="ij")
        points.append(torch.stack((sx, sy), -1).view(-1, 2))
        stride_rows.append(torch.full((h * w, 1), float(stride)))
    return torch.cat(points), torch.cat(stride_rows)


def _ciou(box1: torch.Tensor, box2: torch.Tensor, eps: float = 1e-7) -> torch.Tensor:
    """Complete IoU of xyxy boxes, broadcasting over leading dimensions."""
    b1_x1, b1_y1, b1_x2, b1_y2 = box1.unbind(-1)
    b2_x1, b2_y1, b2_x2, b2_y2 = box2.unbind(-1)
    w1, h1 = b1_x2 - b1_x1, (b1_y2 - b1_y1).clamp(min=eps)
    w2, h2 = b2_x2 - b2_x1, (b2_y2 - b2_y1).clamp(min=eps)
    inter = (torch.minimum(b1_x2, b2_x2) - torch.maximum(b1_x1, b2_x1)).clamp(min=0) * (
        torch.minimum(b1_y2, b2_y2) - torch.maximum(b1_y1, b2_y1)
    ).clamp(min=0)
    iou = inter / (w1 * h1 + w2 * h2 - inter + eps)
    cw = torch.maximum(b1_x2, b2_x2) - torch.minimum(b1_x1, b2_x1)
    chh = torch.maximum(b1_y2, b2_y2) - torch.minimum(b1_y1, b2_y1)
    c2 = cw.pow(2) + chh.pow(2) + eps
    rho2 = ((b2_x1 + b2_x2 - b1_x1 - b1_x2).pow(2) + (b2_y1 + b2_y2 - b1_y1 - b1_y2).pow(2)) / 4
    v = (4 / math.pi**2) * (torch.atan(w2 / h2) - torch.atan(w1 / h1)).pow(2)
    with torch.no_grad():
        alpha = v / (v - iou + (1 + eps))
    return iou - (rho2 / c2 + v * alpha)


@torch.no_grad()
def _assign(
    scores: torch.Tensor,
    boxes: torch.Tensor,
    points: torch.Tensor,
    gt_labels: torch.Tensor,
    gt_boxes: torch.Tensor,
    gt_valid: torch.Tensor,
    topk: int = 10,
    alpha: float = 0.5,
    beta: float = 6.0,
    eps: float = 1e-9,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Task-aligned assignment (Ultralytics ``TaskAlignedAssigner``), dense: every tensor is [B, M, A] or smaller.

    Returns target boxes [B,A,4], target scores [B,A,nc] and the foreground mask [B,A].
    """
    batch, max_obj = gt_labels.shape[:2]
    nc = scores.shape[-1]
    x1y1, x2y2 = gt_boxes.unsqueeze(2).chunk(2, -1)  # [B,M,1,2]
    in_gts = (torch.cat((points - x1y1, x2y2 - points), -1).amin(-1) > eps).float()  # [B,M,A]
    valid = in_gts * gt_valid
    overlaps = _ciou(gt_boxes.unsqueeze(2), boxes.unsqueeze(1)).clamp(min=0) * valid  # [B,M,A]
    labels = gt_labels.long().expand(-1, -1, scores.shape[1])  # [B,M,A]
    class_scores = scores.permute(0, 2, 1).gather(1, labels) * valid
    align = class_scores.pow(alpha) * overlaps.pow(beta)
    topk_idx = align.topk(topk, dim=-1).indices  # [B,M,topk]
    in_topk = torch.zeros_like(align).scatter_(-1, topk_idx, 1.0)
    pos = in_topk * valid  # [B,M,A]
    # an anchor claimed by several boxes goes to the box it overlaps most (branch-free version)
    multi = (pos.sum(1, keepdim=True) > 1).expand(-1, max_obj, -1)
    best = torch.zeros_like(pos).scatter_(1, overlaps.argmax(1, keepdim=True), 1.0)
    pos = torch.where(multi, best, pos)
    fg = pos.sum(1)  # [B,A]
    gt_idx = pos.argmax(1) + torch.arange(batch).unsqueeze(1) * max_obj  # [B,A]
    target_labels = gt_labels.long().view(-1)[gt_idx]  # [B,A]
    target_boxes = gt_boxes.view(-1, 4)[gt_idx]  # [B,A,4]
    target_scores = F.one_hot(target_labels, nc).float() * fg.unsqueeze(-1)
    align = align * pos
    norm = (align * (overlaps * pos).amax(-1, keepdim=True) / (align.amax(-1, keepdim=True) + eps)).amax(1)
    return target_boxes, target_scores * norm.unsqueeze(-1), fg


def detection_loss(preds: Any, targets: Any) -> torch.Tensor:
    """YOLOv8-style loss: 7.5·CIoU + 0.5·BCE + 1.5·DFL, times the batch size (as Ultralytics)."""
    batch = preds[0].shape[0]
    nc = preds[0].shape[1] - 4 * REG_MAX
    flat = torch.cat([p.view(batch, p.shape[1], -1) for p in preds], 2)
    pred_dist, pred_scores = flat.split((4 * REG_MAX, nc), 1)
    return dense_detection_loss(pred_dist, pred_scores, preds, targets)


def dense_detection_loss(
    pred_dist: torch.Tensor,
    pred_scores: torch.Tensor,
    feats: list[torch.Tensor],
    targets: Any,
    strides: tuple[int, ...] = STRIDES,
) -> torch.Tensor:
    """The loss of :func:`detection_loss` on head outputs already flattened over anchors: box distributions
    ``[B, 4·reg_max, A]``, class logits ``[B, nc, A]``, and the feature maps they came from (for the anchor
    grid). ``reg_max`` 1 means the head predicts distances directly (no DFL term)."""
    gt_labels, gt_boxes, gt_valid = targets
    batch = pred_dist.shape[0]
    reg_max = pred_dist.shape[1] // 4
    pred_dist = pred_dist.permute(0, 2, 1).contiguous()  # [B,A,4·reg_max]
    pred_scores = pred_scores.permute(0, 2, 1).contiguous()  # [B,A,nc]
    points, strides_per_anchor = _anchors(feats, strides)
    if reg_max > 1:
        bins = torch.arange(reg_max, dtype=torch.float32)
        dist = pred_dist.view(batch, -1, 4, reg_max).softmax(3).matmul(bins.to(pred_dist.dtype))  # [B,A,4]
    else:
        dist = pred_dist
    lt, rb = dist.chunk(2, -1)
    pred_boxes = torch.cat((points - lt, points + rb), -1)  # grid units

    target_boxes, target_scores, fg = _assign(
        pred_scores.detach().sigmoid(),
        (pred_boxes.detach() * strides_per_anchor).to(gt_boxes.dtype),
        points * strides_per_anchor,
        gt_labels,
        gt_boxes,
        gt_valid,
    )
    score_sum = target_scores.sum().clamp(min=1)
    loss_cls = F.binary_cross_entropy_with_logits(
        pred_scores, target_scores.to(pred_scores.dtype), reduction="sum"
    )
    target_boxes = target_boxes / strides_per_anchor
    weight = target_scores.sum(-1) * fg  # [B,A]
    loss_box = ((1.0 - _ciou(pred_boxes, target_boxes)) * weight).sum()
    if reg_max == 1:
        return (7.5 * loss_box + 0.5 * loss_cls) / score_sum * batch
    target_ltrb = torch.cat((points - target_boxes[..., :2], target_boxes[..., 2:] - points), -1).clamp(
        0, reg_max - 1.01
    )
    left = target_ltrb.long()
    right = left + 1
    w_left = right - target_ltrb
    logits = pred_dist.view(-1, reg_max)
    dfl = F.cross_entropy(logits, left.view(-1), reduction="none").view(
        left.shape
    ) * w_left + F.cross_entropy(logits, right.view(-1), reduction="none").view(left.shape) * (1 - w_left)
    loss_dfl = (dfl.mean(-1) * weight).sum()
    return (7.5 * loss_box + 0.5 * loss_cls + 1.5 * loss_dfl) / score_sum * batch


def yolo_detector(size: str = "n") -> YoloDetector:
    return YoloDetector(size)
