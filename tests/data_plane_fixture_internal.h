// Where a trainer's buffer elements lie in the full tensor: the layout
// arithmetic the data-plane fixture's files share (data_plane_model.cc
// defines it). Private to the data_plane_fixture library; not part of the
// fixture's API.
#ifndef MUONPS_TESTS_DATA_PLANE_FIXTURE_INTERNAL_H_
#define MUONPS_TESTS_DATA_PLANE_FIXTURE_INTERNAL_H_

#include <cstdint>

#include "tests/data_plane_fixture.h"

namespace muonps {
namespace testing {

// Index into the full tensor (experts x rows x cols) of element `i` of a
// buffer that holds rows [begin, end) of every expert from
// `first_expert` on, expert-major.
int64_t FullIndex(int64_t i, int64_t rows, int64_t cols, int64_t begin,
                  int64_t end, int64_t first_expert);

// Whether each trainer holds only its own rows of `m`'s parameter
// (row_sharded with shard_params), not the whole of it.
bool ShardedParam(const MatrixDecl& m);

}  // namespace testing
}  // namespace muonps

#endif  // MUONPS_TESTS_DATA_PLANE_FIXTURE_INTERNAL_H_
