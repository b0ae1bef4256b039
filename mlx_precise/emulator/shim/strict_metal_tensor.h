// Metal 4's tensor API (MSL 4.0: <metal_tensor> and MetalPerformancePrimitives'
// mpp::tensor_ops) for the strict check (strict.py includes this in place of those
// headers when metal_version >= "4.0"). Declarations only, as in strict_metal.h: the
// check parses kernels, so it needs the names and shapes of the API, not its work.
//
// Deliberately permissive: tensor views, slices and cooperative tensors accept the
// arguments Apple's headers accept (and more), so that a kernel built on them is
// checked for everything around them (address spaces, bfloat conversions, pointers,
// ...) without false alarms from an incomplete model of the tensor library itself.
#pragma once

namespace metal {

constexpr constant size_t dynamic_extent = size_t(-1);

// extents<IndexType, E...> (a static extent, or dynamic_extent) and dextents<I, R>.
template <class IndexType, size_t... Extents>
struct extents {
  typedef IndexType index_type;
  static constexpr constant size_t rank_value = sizeof...(Extents);
  constexpr extents() = default;
  template <class... I> constexpr extents(I...) {}
  static constexpr size_t rank() { return sizeof...(Extents); }
  IndexType extent(size_t) const;
};
template <class IndexType, size_t Rank, size_t... E>
struct mps_dextents : mps_dextents<IndexType, Rank - 1, dynamic_extent, E...> {};
template <class IndexType, size_t... E>
struct mps_dextents<IndexType, 0, E...> { typedef extents<IndexType, E...> type; };
template <class IndexType, size_t Rank>
using dextents = typename mps_dextents<IndexType, Rank>::type;

// How a tensor refers to its data: a view built in the kernel (tensor_inline), a
// bound MTLTensor (tensor_handle), or one with an offset (tensor_offset).
struct tensor_inline {};
struct tensor_handle {};
struct tensor_offset {};

template <class ElementType, class Extents, class Descriptor = tensor_handle, class... Tags>
struct tensor {
  typedef ElementType element_type;  // with its address space (`device half`)
  typedef remove_addrspace_t<remove_cv_t<ElementType>> value_type;
  typedef Extents extents_type;
  typedef typename Extents::index_type index_type;
  tensor() = default;
  template <class P, class... A> tensor(P, A...);
  template <class... I> tensor slice(I...) const;
  template <class... I> tensor<ElementType, Extents, Descriptor, Tags...> slice(I...) const __constant;
  index_type get_extent(int) const;
  index_type get_stride(int) const;
  static constexpr size_t get_rank() { return Extents::rank(); }
  template <class... I> ElementType& operator[](I...) const;
  template <class... I> ElementType& operator()(I...) const;
  ElementType* data() const;
};

}  // namespace metal

namespace mpp {
namespace tensor_ops {

template <class T> constexpr constant T dynamic_length_v = T(-1);

enum class reduction_operation { sum, max, min };

// A descriptor is a class in Metal 4 (C++20: a class-type template argument of
// matmul2d). C++ for OpenCL is C++17, so it converts to a packed integer that
// matmul2d takes instead (a converted constant expression).
struct matmul2d_descriptor {
  enum class mode { multiply, multiply_accumulate };
  int m, n, k;
  bool transpose_left, transpose_right, relaxed_precision;
  mode matmul_mode;
  constexpr matmul2d_descriptor(int m_, int n_, int k_ = dynamic_length_v<int>,
                                bool tl = false, bool tr = false, bool rp = false,
                                mode md = mode::multiply)
      : m(m_), n(n_), k(k_), transpose_left(tl), transpose_right(tr),
        relaxed_precision(rp), matmul_mode(md) {}
  constexpr operator ulong() const {
    return (ulong(uint(m)) << 40) ^ (ulong(uint(n)) << 20) ^ ulong(uint(k)) ^
           (ulong(transpose_left) << 61) ^ (ulong(transpose_right) << 62) ^
           (ulong(relaxed_precision) << 63) ^ (ulong(matmul_mode) << 60);
  }
};

// Execution scopes: a thread, a simdgroup, N simdgroups.
struct execution_thread {};
template <int N> struct execution_simdgroups {};
typedef execution_simdgroups<1> execution_simdgroup;

template <class T>
struct cooperative_tensor {
  typedef T value_type;
  template <class U> void load(U) ;
  template <class U> void store(U) const;
  int get_capacity() const;
  int size() const;
  __private T& operator[](int);
  T operator[](int) const;
  template <class... I> bool is_valid_element(I...) const;
  template <class... I> int get_multidimensional_index(I...) const;
  __private T* begin();
  __private T* end();
};

template <ulong Descriptor, class Scope, class... Args>
struct matmul2d {
  template <class Left, class Right, class Destination>
  void run(Left, Right, Destination) const;
  template <class Op, class Left, class Right, class T>
  cooperative_tensor<T> get_destination_cooperative_tensor() const;
  template <class Op, class Left, class Right, class T>
  cooperative_tensor<T> get_left_input_cooperative_tensor() const;
  template <class Op, class Left, class Right, class T>
  cooperative_tensor<T> get_right_input_cooperative_tensor() const;
  template <class Op, class Left, class Right, class T>
  cooperative_tensor<T> get_row_reduction_destination_cooperative_tensor() const;
  template <class Op, class Left, class Right, class T>
  cooperative_tensor<T> get_column_reduction_destination_cooperative_tensor() const;
};

template <class S, class D, class T>
void reduce_rows(S, D, reduction_operation = reduction_operation::sum, T = T(0));
template <class S, class D, class T>
void reduce_columns(S, D, reduction_operation = reduction_operation::sum, T = T(0));

}  // namespace tensor_ops
}  // namespace mpp
