"""A compact pure-Python implementation of the scheduler-side cache work of
SGLang v0.5.15's hybrid cache (extra_buffer mode, page_size 1), written in
the same style SGLang uses (torch index tensors, dict children, per-node
tensors), for benchmarks/bench_lifecycle.py to compare against.

It follows the documented semantics: read-only matches split edges, the
usable prefix ends at the deepest node with a state, branching points are
aligned down to the chunk size, inserts free the caller's duplicate KV
beyond prev_prefix_len, finished requests donate track[keep], unfinished
ones donate it and refill the buffer with a fresh slot.
"""

from __future__ import annotations

import itertools
from array import array
from collections import OrderedDict
from typing import Optional

import torch

_ids = itertools.count()


class Node:
    __slots__ = ("id", "children", "parent", "key", "value", "state", "full_lock", "state_lock")

    def __init__(self) -> None:
        self.id = next(_ids)
        self.children: dict = {}
        self.parent: Optional[Node] = None
        self.key = array("q")
        self.value = torch.empty((0,), dtype=torch.int64)
        self.state: Optional[torch.Tensor] = None
        self.full_lock = 0
        self.state_lock = 0


class Allocator:
    """Free list as a torch tensor: alloc slices the front, free appends."""

    def __init__(self, size: int) -> None:
        self.free_slots = torch.arange(1, size + 1, dtype=torch.int64)

    def available_size(self) -> int:
        return len(self.free_slots)

    def alloc(self, n: int) -> Optional[torch.Tensor]:
        if n > len(self.free_slots):
            return None
        out = self.free_slots[:n]
        self.free_slots = self.free_slots[n:]
        return out

    def free(self, idx: torch.Tensor) -> None:
        if idx.numel():
            self.free_slots = torch.cat((self.free_slots, idx.reshape(-1)))


class PyReq:
    __slots__ = ("tokens", "row", "running", "track", "next", "last_track", "branching", "cow_src",
                 "needs_clear", "prefix", "protected", "node", "committed")

    def __init__(self, tokens: array) -> None:
        self.tokens = tokens
        self.row = None
        self.running = None
        self.track = None
        self.next = None
        self.last_track = None
        self.branching = None
        self.cow_src = None
        self.needs_clear = False
        self.prefix = torch.empty((0,), dtype=torch.int64)
        self.protected = 0
        self.node = None
        self.committed = 0


class PyHybridCache:
    def __init__(self, kv_size: int, state_size: int, rows: int, max_ctx: int, chunk: int = 64,
                 interval: int = 256) -> None:
        self.kv = Allocator(kv_size)
        self.states = Allocator(state_size)
        self.free_rows = list(range(1, rows + 1))
        self.req_to_token = torch.zeros((rows + 1, max_ctx), dtype=torch.int32)
        self.track_map = torch.zeros((rows + 1, 2), dtype=torch.int64)
        self.chunk = chunk
        self.interval = interval
        self.root = Node()
        self.root.full_lock = self.root.state_lock = 1
        self.full_lru: OrderedDict = OrderedDict()   # id -> node, oldest first
        self.state_lru: OrderedDict = OrderedDict()
        self.cow = 0
        self.donated = 0

    # -- tree ------------------------------------------------------------------

    @staticmethod
    def _common(a: array, b: array) -> int:
        n = min(len(a), len(b))
        if a[:n] == b[:n]:
            return n
        lo, hi = 0, n
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if a[:mid] == b[:mid]:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _touch(self, node: Node) -> None:
        while node is not self.root:
            self.full_lru[node.id] = node
            self.full_lru.move_to_end(node.id)
            if node.state is not None:
                self.state_lru[node.id] = node
                self.state_lru.move_to_end(node.id)
            node = node.parent

    def _split(self, child: Node, n: int) -> Node:
        new = Node()
        new.parent = child.parent
        new.key = child.key[:n]
        new.value = child.value[:n].clone()
        new.full_lock = child.full_lock
        new.children = {child.key[n]: child}
        child.parent.children[child.key[0]] = new
        child.key = child.key[n:]
        child.value = child.value[n:].clone()
        child.parent = new
        self.full_lru[new.id] = new
        return new

    def match(self, key: array):
        node, values, best_len, best = self.root, [], 0, self.root
        while len(key) and key[0] in node.children:
            child = node.children[key[0]]
            if node.state is not None:
                best_len, best = len(values), node
            p = self._common(child.key, key)
            if p < len(child.key):
                node = self._split(child, p)
                values.append(node.value)
                break
            values.append(child.value)
            node = child
            key = key[p:]
        if node.state is not None:
            best_len, best = len(values), node
        self._touch(best if best is not self.root else node)
        branching = None
        if len(values) > best_len:
            aligned = sum(len(v) for v in values) // self.chunk * self.chunk
            branching = aligned if aligned > 0 else None
        idx = torch.cat(values[:best_len]) if best_len else torch.empty((0,), dtype=torch.int64)
        return idx, best, branching

    def insert(self, key: array, value: torch.Tensor, state: torch.Tensor, prev: int):
        node, total = self.root, 0
        while len(key) and key[0] in node.children:
            child = node.children[key[0]]
            p = self._common(child.key, key)
            if prev < total + p:
                self.kv.free(value[max(0, prev - total):p])
            total += p
            if p < len(child.key):
                child = self._split(child, p)
            node = child
            key = key[p:]
            value = value[p:]
        if len(key):
            leaf = Node()
            leaf.parent = node
            leaf.key = key
            leaf.value = value.clone()
            leaf.state = state
            node.children[key[0]] = leaf
            self._touch(leaf)
            return total, False, leaf
        if node is not self.root and node.state is None:
            node.state = state
            self._touch(node)
            return total, False, node
        return total, True, node

    def lock(self, node: Node) -> None:
        if node.state is not None:
            node.state_lock += 1
        while node is not self.root:
            node.full_lock += 1
            node = node.parent

    def unlock(self, node: Node) -> None:
        if node.state is not None and node.state_lock > 0:
            node.state_lock -= 1
        while node is not self.root:
            node.full_lock -= 1
            node = node.parent

    def _delete_leaf(self, x: Node) -> int:
        freed = len(x.value)
        self.kv.free(x.value)
        if x.state is not None:
            self.states.free(x.state)
            self.state_lru.pop(x.id, None)
        self.full_lru.pop(x.id, None)
        del x.parent.children[x.key[0]]
        p = x.parent
        while p is not self.root and not p.children and p.state is None and p.full_lock == 0:
            freed += len(p.value)
            self.kv.free(p.value)
            self.full_lru.pop(p.id, None)
            del p.parent.children[p.key[0]]
            p = p.parent
        return freed

    def evict_states(self, n: int) -> int:
        done = 0
        for nid, x in list(self.state_lru.items()):
            if done >= n:
                break
            if x.state_lock or nid not in self.state_lru:
                continue
            if x.children:
                self.states.free(x.state)
                x.state = None
                del self.state_lru[nid]
            elif x.full_lock == 0:
                self._delete_leaf(x)
            else:
                continue
            done += 1
        return done

    def evict_tokens(self, n: int) -> int:
        done = 0
        while done < n:
            victim = next((x for x in self.full_lru.values() if not x.children and x.full_lock == 0), None)
            if victim is None:
                break
            done += self._delete_leaf(victim)
        return done

    def _alloc_state(self) -> torch.Tensor:
        s = self.states.alloc(1)
        if s is None:
            self.evict_states(1)
            s = self.states.alloc(1)
            assert s is not None
        return s

    # -- the scheduler-side lifecycle ---------------------------------------------

    def schedule(self, req: PyReq) -> tuple:
        """match (cap len-1, cow) + admission + lock + KV + tracking."""
        key = req.tokens[: max(len(req.tokens) - 1, 0)]
        idx, node, branching = self.match(key)
        req.prefix, req.node, req.branching = idx, node, branching
        req.protected = len(idx)
        if node.state is not None:
            if req.running is None:
                req.running = self._alloc_state()[0]
            req.cow_src = node.state
            self.cow += 1
        if self.states.available_size() < 3:
            self.evict_states(3 - self.states.available_size())
        req.row = self.free_rows.pop(0)
        if req.running is None:
            req.running = self.states.alloc(1)[0]
            req.needs_clear = True
        req.track = self.states.alloc(2)
        req.next = 0
        self.track_map[req.row] = req.track
        self.lock(node)
        P, E = len(idx), len(req.tokens) - len(idx)
        if self.kv.available_size() < E:
            self.evict_tokens(E - self.kv.available_size())
        kv = self.kv.alloc(E)
        self.req_to_token[req.row, :P] = idx.to(torch.int32)
        self.req_to_token[req.row, P:P + E] = kv.to(torch.int32)
        req.committed = P + E
        slot = int(req.track[req.next].item())
        mask = E >= self.chunk
        if mask:
            seqlen = P + E
            aligned = P + (E // self.chunk) * self.chunk
            req.next = 1 - req.next
            b = req.branching
            if b is not None and (b - P) % self.chunk == 0 and P < b < seqlen:
                aligned = b
            req.last_track = aligned
        return slot, mask

    def cache_unfinished(self, req: PyReq) -> None:
        if req.last_track is None:
            req.prefix = self.req_to_token[req.row, :req.committed].to(torch.int64)
            return
        n = req.last_track
        kv = self.req_to_token[req.row, :n].to(torch.int64)
        new_slot = self._alloc_state()
        keep = 1 - req.next
        donated = req.track[keep].reshape(1).clone()
        req.track[keep] = new_slot[0]
        self.track_map[req.row] = req.track
        pl, exist, _ = self.insert(req.tokens[:n], kv, donated, req.protected)
        if exist:
            self.states.free(donated)
        else:
            self.donated += 1
        idx, node, _ = self.match(req.tokens[:n])
        self.req_to_token[req.row, req.protected:len(idx)] = idx[req.protected:].to(torch.int32)
        self.unlock(req.node)
        self.lock(node)
        req.prefix = torch.cat([idx, self.req_to_token[req.row, len(idx):req.committed].to(torch.int64)])
        req.protected = len(idx)
        req.node = node
        req.last_track = None

    def decode(self, req: PyReq, token: int) -> tuple:
        req.tokens.append(token)
        if self.kv.available_size() < 1:
            self.evict_tokens(1)
        loc = self.kv.alloc(1)
        self.req_to_token[req.row, req.committed] = loc.to(torch.int32)[0]
        req.committed += 1
        slot = int(req.track[req.next].item())
        mask = req.committed % self.interval == 0
        if mask:
            req.last_track = req.committed
            req.next = 1 - req.next
        return slot, mask

    def finish(self, req: PyReq) -> None:
        kv = self.req_to_token[req.row, :req.committed].to(torch.int64)
        n = req.last_track or 0
        self.kv.free(kv[max(n, req.protected):])
        keep = 1 - req.next
        exist = True
        if n > 0:
            _, exist, _ = self.insert(req.tokens[:n], kv[:n], req.track[keep].reshape(1).clone(), req.protected)
        to_free = [req.running.reshape(1)]
        for j in range(2):
            if exist or j != keep:
                to_free.append(req.track[j].reshape(1))
        if not exist:
            self.donated += 1
        self.states.free(torch.cat(to_free))
        self.unlock(req.node)
        self.free_rows.append(req.row)
        req.row = req.running = req.track = None
