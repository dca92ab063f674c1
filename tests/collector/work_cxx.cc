// C++ part of the workload: new/delete, aligned new, containers.
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

struct alignas(64) Wide {
    uint64_t v[8];
};

extern "C" int cpw_cxx(void)
{
    uint64_t h = 0;
    std::map<std::string, std::vector<int>> m;
    for (int i = 0; i < 200000; i++) {
        std::string k = "key" + std::to_string(i % 5000);
        m[k].push_back(i);
        auto w = std::make_unique<Wide>();
        w->v[i % 8] = (uint64_t)i;
        h += w->v[i % 8] + (((uintptr_t)w.get() & 63) == 0);
        int *arr = new int[(i % 100) + 1];
        arr[0] = i;
        h += (uint64_t)arr[0];
        delete[] arr;
        if (i % 1000 == 0) m.erase(m.begin());
    }
    for (auto &kv : m)
        h = h * 31 + kv.second.size();
    std::printf("%llu %zu\n", (unsigned long long)h, m.size());
    return 0;
}
