"""Prefix cache as a compressed radix tree over token ids, with LRU eviction of unlocked leaves.

Why: prefix hits must come from the tokens a workload really repeats. SGLang's RadixCache matches at
1-token granularity (page size 1); vLLM's prefix cache hashes full 16-token blocks, which is the same
tree with matches rounded down to whole pages. Tokens held by the tree occupy KV-pool slots; locked
nodes (used by running requests) are never evicted.
"""

from __future__ import annotations

import heapq
import itertools

_tick = itertools.count()


def _common(a: list[int], a_off: int, b: list[int]) -> int:
    """Length of the common prefix of a[a_off:] and b."""
    n = min(len(a) - a_off, len(b))
    i = 0
    step = 64
    while i + step <= n and a[a_off + i : a_off + i + step] == b[i : i + step]:
        i += step
    while i < n and a[a_off + i] == b[i]:
        i += 1
    return i


class Node:
    __slots__ = ("access", "children", "key", "lock", "parent")

    def __init__(self, key: list[int], parent: Node | None) -> None:
        self.key = key
        self.parent = parent
        self.children: dict[object, Node] = {}
        self.lock = 0
        self.access = next(_tick)


class RadixCache:
    """Token-id prefix tree. `page` = match granularity (1 = SGLang, 16 = vLLM blocks)."""

    def __init__(self, page: int = 1) -> None:
        self.page = page
        self.reset()

    def reset(self) -> None:
        self.root = Node([], None)
        self.root.lock = 1
        self.total = 0  # tokens stored in the tree
        self.protected = 0  # tokens on locked paths

    @property
    def evictable(self) -> int:
        return self.total - self.protected

    def _ckey(self, key: list[int], off: int = 0) -> object:
        return key[off] if self.page == 1 else tuple(key[off : off + self.page])

    def match(self, tokens: list[int]) -> tuple[int, Node]:
        """Longest cached prefix (whole pages), splitting a node if the match ends inside it."""
        node = self.root
        pos = 0
        limit = len(tokens) - len(tokens) % self.page
        tick = next(_tick)
        while pos < limit:
            child = node.children.get(self._ckey(tokens, pos))
            if child is None:
                break
            n = _common(tokens, pos, child.key)
            n -= n % self.page
            if n == 0:
                break
            child.access = tick
            if n < len(child.key):
                child = self._split(child, n)
                node = child
                pos += n
                break
            node = child
            pos += n
        return pos, node

    def _split(self, child: Node, n: int) -> Node:
        """Split `child` so its first n tokens become a new parent node; return that parent."""
        parent = child.parent
        assert parent is not None
        mid = Node(child.key[:n], parent)
        mid.lock = child.lock
        mid.access = child.access
        parent.children[self._ckey(child.key)] = mid
        child.key = child.key[n:]
        child.parent = mid
        mid.children[self._ckey(child.key)] = child
        return mid

    def insert(self, tokens: list[int]) -> int:
        """Insert a sequence (rounded down to whole pages); returns the number of new tokens stored."""
        limit = len(tokens) - len(tokens) % self.page
        node = self.root
        pos = 0
        tick = next(_tick)
        while pos < limit:
            ck = self._ckey(tokens, pos)
            child = node.children.get(ck)
            if child is None:
                new = Node(tokens[pos:limit], node)
                new.access = tick
                node.children[ck] = new
                self.total += limit - pos
                return limit - pos
            n = _common(tokens, pos, child.key)
            n -= n % self.page
            child.access = tick
            if n < len(child.key):
                child = self._split(child, n)
            node = child
            pos += n
        return 0

    def lock(self, node: Node) -> None:
        while node is not self.root:
            if node.lock == 0:
                self.protected += len(node.key)
            node.lock += 1
            node = node.parent  # type: ignore[assignment]

    def unlock(self, node: Node) -> None:
        while node is not self.root:
            node.lock -= 1
            if node.lock == 0:
                self.protected -= len(node.key)
            node = node.parent  # type: ignore[assignment]

    def evict(self, need: int) -> int:
        """Free at least `need` tokens from unlocked leaves, least recently used first."""
        if need <= 0:
            return 0
        heap = []
        stack = [self.root]
        while stack:
            nd = stack.pop()
            if nd.children:
                stack.extend(nd.children.values())
            elif nd is not self.root and nd.lock == 0:
                heap.append((nd.access, id(nd), nd))
        heapq.heapify(heap)
        freed = 0
        while heap and freed < need:
            _, _, nd = heapq.heappop(heap)
            parent = nd.parent
            assert parent is not None
            del parent.children[self._ckey(nd.key)]
            freed += len(nd.key)
            self.total -= len(nd.key)
            if parent is not self.root and not parent.children and parent.lock == 0:
                heapq.heappush(heap, (parent.access, id(parent), parent))
        return freed
