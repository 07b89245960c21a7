"""Inputs that do not come from the matrix's seeded draws: tensors captured from a real model call
(``capture`` writes them, ``tensor_files`` reads them, ``captured`` turns a file into a cell) and the
cells of a real model's shapes (``model_cells``).
"""
