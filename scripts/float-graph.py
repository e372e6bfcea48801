"""Derives a float graph from a dynamically quantised ONNX model.

The shipped re-ranker is quantised to int8 for CPUs: every MatMul became DynamicQuantizeLinear ->
MatMulInteger -> Cast -> Mul (scales), and the embedding tables are int8, read through
DequantizeLinear. The CUDA provider has no kernels for those ops, so it runs them on the CPU and
copies between host and device at every layer. This rewrites each such pattern back into a plain
MatMul (or Gather) over weights dequantised once, here: (w - zero_point) * scale, in float32. The
result computes what the int8 graph would without quantising the activations.

Usage: float-graph.py IN.onnx OUT.onnx
"""
import sys

import numpy as np
import onnx
from onnx import numpy_helper


def main(source, target):
    model = onnx.load(source)
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    users = {}
    for n in graph.node:
        for i in n.input:
            users.setdefault(i, []).append(n)

    def array(name):
        return numpy_helper.to_array(inits[name])

    def only_user(name, op):
        found = users.get(name, [])
        assert len(found) == 1 and found[0].op_type == op, f"{name}: expected one {op}, found {[u.op_type for u in found]}"
        return found[0]

    drop, new_inits, replaced = set(), [], {}
    for node in graph.node:
        if node.op_type == "MatMulInteger":
            a_q, w_q, _, w_zp = node.input
            quantise = producer[a_q]
            assert quantise.op_type == "DynamicQuantizeLinear", quantise.op_type
            cast = only_user(node.output[0], "Cast")
            scale = only_user(cast.output[0], "Mul")
            scales = producer[[i for i in scale.input if i != cast.output[0]][0]]
            assert scales.op_type == "Mul", scales.op_type
            w_scale = [i for i in scales.input if i in inits][0]
            weight = (array(w_q).astype(np.float32) - array(w_zp).astype(np.float32)) * array(w_scale)
            name = w_q.removesuffix("_quantized") + "_float"
            new_inits.append(numpy_helper.from_array(weight.astype(np.float32), name))
            replaced[node.name] = onnx.helper.make_node(
                "MatMul", [quantise.input[0], name], [scale.output[0]], name=node.name.removesuffix("_quant"))
            drop.update({id(cast), id(scale), id(scales)})
            drop_if_unused = quantise
            replaced.setdefault("__quantisers", set()).add(id(drop_if_unused))
        elif node.op_type == "DequantizeLinear":
            data, scale, zero = node.input
            gather = producer[data]
            assert gather.op_type == "Gather", gather.op_type
            table = gather.input[0]
            weight = (array(table).astype(np.float32) - array(zero).astype(np.float32)) * array(scale)
            name = table.removesuffix("_quantized") + "_float"
            new_inits.append(numpy_helper.from_array(weight.astype(np.float32), name))
            replaced[gather.name] = onnx.helper.make_node(
                "Gather", [name, gather.input[1]], [node.output[0]], name=gather.name,
                **{a.name: onnx.helper.get_attribute_value(a) for a in gather.attribute})
            drop.add(id(node))

    quantisers = replaced.pop("__quantisers", set())
    nodes = []
    for node in graph.node:
        if id(node) in drop or id(node) in quantisers:
            continue
        nodes.append(replaced.get(node.name, node))
    del graph.node[:]
    graph.node.extend(nodes)

    # Keep only the initializers some node still reads (the int8 weights, their scales and zero points go).
    graph.initializer.extend(new_inits)
    read = {i for n in graph.node for i in n.input}
    kept = [i for i in graph.initializer if i.name in read]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    model.producer_name, model.producer_version = "lacuna float-graph", "1"
    left = {n.op_type for n in graph.node} & {"MatMulInteger", "DynamicQuantizeLinear", "DequantizeLinear"}
    assert not left, f"quantised ops left: {left}"
    onnx.checker.check_model(model)
    onnx.save(model, target)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
